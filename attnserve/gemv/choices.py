"""What a GemvPlan measured, as records, and the small rules that turn measurements into choices.

The row counts measured (``plan_rows``: the CUDA-graph decode buckets up to ``MAX_ROWS``), the margins a
faster kernel must beat cuBLAS by, one record per measured (N, K, M) (``GemvChoice``, ``SiluMulChoice``,
``GreedyChoice``), and the table a layer reads: row count 0..``MAX_ROWS`` -> the chosen function or None
(``bucket_table``: row counts between buckets take the next measured bucket's choice).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from attnserve.gemv.blas import cublaslt_linear

if TYPE_CHECKING:
    from attnserve.kernels.triton_gemv import GemvConfig

DECODE_MS = (1, 2, 4, 8, 16, 32, 48, 64)  # the decode CUDA-graph buckets up to MAX_ROWS (cuda_graph.capture_sizes)
MAX_ROWS = 64  # row counts above this always take cuBLAS (triton_gemv.MAX_M)
MARGIN = 0.05  # Triton must be this much faster than cuBLAS to be used
LT_MARGIN = 0.02  # cuBLASLt (the same kind of kernels, another heuristic) this much


def plan_rows(sizes: list[int] | tuple[int, ...] | None = None) -> tuple[int, ...]:
    """The row counts a plan measures: the CUDA-graph batch sizes ``sizes`` (``cuda_graph.capture_sizes``;
    None: ``DECODE_MS``) of 1..``MAX_ROWS`` rows, ascending."""
    return tuple(sorted({s for s in (DECODE_MS if sizes is None else sizes) if 1 <= s <= MAX_ROWS}))


def pick_fastest(
    reference_us: float, timed: list[tuple[float, GemvConfig]], margin: float
) -> tuple[float | None, GemvConfig | None, bool]:
    """The fastest of ``timed`` (microseconds, config; the candidates that ran and agreed) as (its time, its
    config, whether it replaces the reference: at most ``1 - margin`` of ``reference_us``); (None, None,
    False) when nothing was timed. Ties keep the first."""
    if not timed:
        return None, None, False
    us, cfg = min(timed, key=lambda t: t[0])
    return us, cfg, us <= (1.0 - margin) * reference_us


@dataclass(frozen=True)
class GemvChoice:
    """One measured (N, K, M): cuBLAS's time, the best Triton candidate and its time, and the verdict."""

    n: int
    k: int
    m: int
    cublas_us: float
    triton_us: float | None  # None: no candidate ran (or none agreed with F.linear)
    config: GemvConfig | None  # the best candidate
    use_triton: bool
    cublaslt_us: float | None = None  # F.linear through cuBLASLt (None: not measured, or disagreed)
    use_cublaslt: bool = False  # cuBLASLt instead of cuBLAS (never with use_triton)

    def label(self) -> str:
        """What runs: ``triton <config>``, ``cuBLASLt`` or ``cuBLAS``."""
        return f"triton {self.config.label()}" if self.use_triton else "cuBLASLt" if self.use_cublaslt else "cuBLAS"


@dataclass(frozen=True)
class SiluMulChoice:
    """One measured (N, K, M) of a SwiGLU layer: ``silu_and_mul`` then the plain choice (``unfused``: cuBLAS
    or the chosen Triton config, its label in ``unfused_label``) against the best fused GEMV. For a down
    projection (``GemvPlan.silu_mul``) K is its input width I and the fused GEMV reads (M, 2I); for a gate/up
    layer (``GemvPlan.swiglu``) N is 2I, the plain choice runs before ``silu_and_mul`` and the fused GEMV
    writes (M, I)."""

    n: int
    k: int
    m: int
    unfused_us: float
    unfused_label: str
    fused_us: float | None  # None: no candidate ran (or none agreed)
    config: GemvConfig | None  # the best fused candidate
    use_fused: bool


@dataclass(frozen=True)
class GreedyChoice:
    """One measured row count M of the LM head (N, K): its choice then the argmax (``unfused``) against the best
    fused greedy head."""

    n: int
    k: int
    m: int
    unfused_us: float
    unfused_label: str
    fused_us: float | None  # None: no candidate ran (or none agreed)
    config: object | None  # the best triton_greedy_head.GreedyHeadConfig
    use_fused: bool


def bucket_table(chosen: dict[int, Callable | None]) -> tuple[Callable | None, ...] | None:
    """Row count (index 0..MAX_ROWS) -> the GEMV chosen at the smallest measured bucket >= it (``chosen``:
    bucket (1..MAX_ROWS) -> GEMV or None); None past the largest bucket, and None for the whole table when
    no row count has a GEMV."""
    measured = sorted(chosen)
    entries: list[Callable | None] = [None] * (MAX_ROWS + 1)
    for rows in range(1, MAX_ROWS + 1):
        bucket = next((m for m in measured if m >= rows), None)
        entries[rows] = chosen[bucket] if bucket is not None else None
    return tuple(entries) if any(entries) else None


def chosen_gemv(c: GemvChoice) -> Callable | None:
    """The function a choice runs, None for cuBLAS."""
    if c.use_triton:
        from attnserve.kernels.triton_gemv import gemv

        return functools.partial(gemv, config=c.config)
    return cublaslt_linear if c.use_cublaslt else None
