"""``bench attention``'s printed table: figures with 3 significant digits, each rate column in the SI prefix of
its largest figure (the JSON keeps them exact in TB/s and TFLOP/s)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from attnserve.benchmarks.attention import AttentionRow


def significant(x: float, digits: int = 3) -> str:
    """``x`` in fixed point with ``digits`` significant digits, or all of its integer digits where it has
    more: 0.0042 -> "0.00420", 3.14159 -> "3.14", 1234.5 -> "1234". A small figure never prints as 0.000."""
    if x == 0 or not math.isfinite(x):
        return format(x, "g")
    exponent = math.floor(math.log10(abs(float(f"{x:.{digits - 1}e}"))))  # of x rounded: 0.0009996 -> -3
    return format(x, f".{max(0, digits - 1 - exponent)}f")


PREFIXES = (("T", 1.0), ("G", 1e-3), ("M", 1e-6))  # unit prefix, its size in tera


def column_unit(values: list[float | None]) -> tuple[str, float]:
    """The largest prefix in which the column's largest figure is at least 1 (M at the least; T for a column
    without figures), and the factor that turns a figure in tera into it: 0.0042 TB/s prints as 4.20 GB/s."""
    figures = [v for v in values if v is not None]
    top = max(figures, default=PREFIXES[0][1])
    prefix, size = next((p for p in PREFIXES if top >= p[1]), PREFIXES[-1])
    return prefix, 1 / size


def format_table(rows: list[AttentionRow]) -> str:
    """The short table printed last. Figures have 3 significant digits, KV bytes/s and FLOP/s each in the
    unit of its column's largest figure (T, else G, else M); the JSON keeps them exact in TB/s and TFLOP/s."""
    kv_prefix, kv_factor = column_unit([r.kv_TBps for r in rows])
    fl_prefix, fl_factor = column_unit([r.tflops for r in rows])
    lines = [
        f"{'backend':<15} {'phase':<8} {'shape':>12} {'time us':>10} {f'KV {kv_prefix}B/s':>9} "
        f"{f'{fl_prefix}FLOP/s':>9}  status"
    ]
    f = lambda x, factor: "" if x is None else significant(x * factor)  # noqa: E731
    for r in rows:
        shape = f"{r.batch_size}x{r.context_len}" if r.phase == "decode" else f"L={r.context_len}"
        time_us = "" if r.time_us is None else format(r.time_us, ".1f")
        lines.append(
            f"{r.backend:<15} {r.phase:<8} {shape:>12} {time_us:>10} {f(r.kv_TBps, kv_factor):>9} "
            f"{f(r.tflops, fl_factor):>9}  {r.status}"
        )
    return "\n".join(lines)
