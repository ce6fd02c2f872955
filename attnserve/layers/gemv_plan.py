"""GemvPlan: where the Triton GEMV (``triton_gemv.py``) beats cuBLAS on this GPU, measured at start-up.

For every distinct weight shape (N, K) of the model's linear layers and LM head, and each decode batch
size M of the CUDA-graph buckets up to 8 (1, 2, 4, 8), the plan times ``F.linear`` (cuBLAS) and a handful
of Triton launch configurations, and keeps Triton only where its best one is faster by ``margin`` (5%) and
agrees with ``F.linear``. Each layer then holds a small table (``layer.gemv``: row count -> the chosen
GEMV, or None for cuBLAS), set once; the forward pass reads one attribute when the table is unset.
Row counts between buckets (3, 5..7: the LM head sees the exact request count) use the next bucket's
choice: the kernel pads rows to the same power of two.

Timing imitates a decode step inside a CUDA graph: each measurement is one graph of back-to-back calls
(``calls``, default 20) cycling through copies of the weight whose total exceeds twice the L2 cache, so
no call finds its weight in L2 (in a real step the rest of the model has passed through L2 in between),
timed with CUDA events over several replays.

Triton is imported when a plan is measured, never by importing this module.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from attnserve.layers.triton_gemv import GemvConfig

logger = logging.getLogger(__name__)

DECODE_MS = (1, 2, 4, 8)  # the decode CUDA-graph buckets up to 8 (cuda_graph.capture_sizes)
MAX_ROWS = 8  # row counts above this always take cuBLAS
MARGIN = 0.05  # Triton must be this much faster than cuBLAS to be used

# FMA tiles for one row (block_n, block_k per 2-byte element, num_warps): 32..128 float32 of register tile
# per thread; for M rows block_n shrinks by M's power of two (the tile is M times taller)
_FMA_TILES = [(8, 512, 4), (16, 512, 4), (32, 256, 4), (16, 1024, 8), (32, 512, 8), (64, 256, 8), (32, 512, 4)]
# tensor-core tiles (block_n, block_k, num_warps, num_stages): <= ~125 KB of shared memory in flight
_DOT_TILES = [(32, 128, 4, 4), (64, 128, 4, 4), (64, 256, 4, 3), (128, 128, 8, 3), (32, 256, 4, 4), (128, 64, 4, 4)]


def _pow2(v: int) -> int:
    return 1 << max(0, (v - 1).bit_length())


def auto_split(n: int, k: int, block_n: int, block_k: int, num_sms: int) -> int:
    """Splits of K so that about ``4 * num_sms`` programs run, each with at least one full K step."""
    tiles = -(-n // block_n)
    split = 1
    while tiles * split < 4 * num_sms and split < 32 and k // (2 * split) >= block_k:
        split *= 2
    return split


def sweep_configs(n: int, k: int, m: int, elem_bytes: int = 2, num_sms: int = 132) -> list[GemvConfig]:
    """A few dozen launch configurations for (N, K, M): the default and it with a shallower and a deeper
    pipeline; FMA tiles with the automatic split, half and double it; tensor-core tiles (16-bit only) with
    the automatic split and double it."""
    from attnserve.layers.triton_gemv import GemvConfig, default_config

    rows = _pow2(m)
    base = default_config(n, k, m, elem_bytes, num_sms)
    out = [base] + [GemvConfig(base.block_n, base.block_k, base.split_k, base.num_warps, stages, base.dot)
                    for stages in ((1, 3) if not base.dot else (2, 5))]
    for bn, bk, warps in _FMA_TILES:
        bn = max(1, bn // rows)
        bk = min(bk * 2 // elem_bytes, _pow2(k))
        s = auto_split(n, k, bn, bk, num_sms)
        for split in {max(1, s // 2), s, min(32, 2 * s)}:
            out.append(GemvConfig(bn, max(16, bk), split, num_warps=warps, num_stages=2))
    if elem_bytes == 2:
        for bn, bk, warps, stages in _DOT_TILES:
            bk = min(bk, _pow2(k))
            s = auto_split(n, k, bn, bk, num_sms)
            for split in {s, min(32, 2 * s)}:
                out.append(GemvConfig(bn, max(16, bk), split, num_warps=warps, num_stages=stages, dot=True))
    return list(dict.fromkeys(out))


def candidate_configs(n: int, k: int, m: int, elem_bytes: int = 2, num_sms: int = 132) -> list[GemvConfig]:
    """The handful the start-up plan times: the default, its split halved and doubled, and two tiles of
    the other kind (FMA <-> tensor cores) or shape."""
    from attnserve.layers.triton_gemv import GemvConfig, default_config

    base = default_config(n, k, m, elem_bytes, num_sms)
    out = [base,
           GemvConfig(base.block_n, base.block_k, max(1, base.split_k // 2), base.num_warps, base.num_stages, base.dot),
           GemvConfig(base.block_n, base.block_k, min(32, base.split_k * 2), base.num_warps, base.num_stages, base.dot)]
    rows = _pow2(m)
    bk = min(512 * 2 // elem_bytes, _pow2(k))
    fma_bn = max(1, 32 // rows)
    out.append(GemvConfig(fma_bn, bk, auto_split(n, k, fma_bn, bk, num_sms), num_warps=8))
    if elem_bytes == 2:
        bk = min(256, _pow2(k))
        out.append(GemvConfig(64, bk, auto_split(n, k, 64, bk, num_sms), num_warps=4, num_stages=3, dot=True))
    return list(dict.fromkeys(c for c in out if c.block_k <= max(16, _pow2(k))))


# ------------------------------------------------------------------------------------------------ timing
def l2_bytes(device: torch.device) -> int:
    return int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 << 20))


def weight_copies(weight: torch.Tensor, min_bytes: int) -> list[torch.Tensor]:
    """``weight`` and random copies of it until their bytes reach ``min_bytes`` (at least one: itself)."""
    size = weight.numel() * weight.element_size()
    copies = [weight]
    while len(copies) * size < min_bytes:
        copies.append(torch.randn_like(weight))
    return copies


def time_per_call_us(call: Callable[[torch.Tensor], object], weights: list[torch.Tensor], calls: int = 20,
                     replays: int = 10) -> float:
    """Mean device time of ``call(w)`` in microseconds: one CUDA graph of back-to-back calls cycling through
    ``weights``, replayed ``replays`` times between two CUDA events. The first call (compiling, allocating)
    runs outside the graph; an error there propagates before any capture starts."""
    call(weights[0])
    torch.cuda.synchronize()
    calls = -(-max(calls, len(weights)) // len(weights)) * len(weights)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            call(weights[i % len(weights)])
    graph.replay()  # warm
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    us = start.elapsed_time(end) * 1000.0 / (replays * calls)
    del graph
    return us


def agrees(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Within 2 ulp of ``F.linear`` plus a float32 summation slack (the GPU tests' tolerance)."""
    scale = float(want.float().abs().max().clamp_min(1e-30))
    eps = torch.finfo(want.dtype).eps if want.dtype != torch.float32 else 1e-5
    err = (got.float() - want.float()).abs()
    return bool((err <= 2 * eps * want.float().abs() + 1e-5 * scale).all())


# --------------------------------------------------------------------------------------------- the plan
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


def gemv_layers(model: nn.Module) -> list[tuple[nn.Module, torch.Tensor]]:
    """(module, weight) of every layer that consults ``module.gemv``: the column- and row-parallel linear
    layers and the LM head (an untied ``ParallelLMHead``, else the tied embedding)."""
    from attnserve.layers.embedding import ParallelLMHead, VocabParallelEmbedding
    from attnserve.layers.linear import ColumnParallelLinear, RowParallelLinear

    mods = list(model.modules())
    heads = ([m for m in mods if isinstance(m, ParallelLMHead)]
             or [m for m in mods if isinstance(m, VocabParallelEmbedding)])
    linears = [m for m in mods if isinstance(m, (ColumnParallelLinear, RowParallelLinear))]
    return [(m, m.weight) for m in linears + heads]


@dataclass
class GemvPlan:
    """The measured choices, keyed by (N, K, M); :meth:`apply` hands each layer its table."""

    choices: dict[tuple[int, int, int], GemvChoice] = field(default_factory=dict)
    seconds: float = 0.0

    def table(self, n: int, k: int) -> tuple[Callable | None, ...] | None:
        """Row count (index 0..MAX_ROWS) -> the chosen GEMV ``f(x, weight, bias)``, or None for cuBLAS;
        None when Triton wins at no row count of (N, K)."""
        from attnserve.layers.triton_gemv import gemv

        entries: list[Callable | None] = [None] * (MAX_ROWS + 1)
        measured = sorted(m for (nn_, kk, m) in self.choices if (nn_, kk) == (n, k))
        for rows in range(1, MAX_ROWS + 1):
            bucket = next((m for m in measured if m >= rows), None)
            c = self.choices.get((n, k, bucket)) if bucket is not None else None
            if c is not None and c.use_triton:
                entries[rows] = functools.partial(gemv, config=c.config)
        return tuple(entries) if any(entries) else None

    def apply(self, model: nn.Module) -> GemvPlan:
        """Set ``layer.gemv`` on every layer (None where cuBLAS stays); logs how many layers use Triton."""
        used = 0
        tables: dict[tuple[int, int], tuple | None] = {}
        for module, weight in gemv_layers(model):
            key = tuple(weight.shape)
            if key not in tables:
                tables[key] = self.table(*key)
            module.gemv = tables[key]
            used += tables[key] is not None
        logger.info("GEMV plan: %d of %d linear layers use the Triton GEMV for some decode batch sizes",
                    used, len(gemv_layers(model)))
        return self

    @classmethod
    def measure(cls, model: nn.Module, ms: tuple[int, ...] = DECODE_MS, margin: float | None = None,
                calls: int = 20, replays: int = 10) -> GemvPlan:
        """Time cuBLAS and :func:`candidate_configs` for each distinct layer shape and row count in ``ms``;
        Triton is used where its best time is at most ``1 - margin`` (default ``MARGIN``) of cuBLAS's."""
        margin = MARGIN if margin is None else margin
        from attnserve.layers.triton_gemv import gemv, prepare

        t0 = time.perf_counter()
        plan = cls()
        shapes = dict.fromkeys(tuple(w.shape) for _, w in gemv_layers(model))
        weights = {tuple(w.shape): w for _, w in gemv_layers(model)}
        if not shapes:
            return plan
        any_w = next(iter(weights.values()))
        device, dtype = any_w.device, any_w.dtype
        prepare(device)
        num_sms = torch.cuda.get_device_properties(device).multi_processor_count
        with torch.no_grad():
            for n, k in shapes:
                copies = weight_copies(weights[(n, k)], 2 * l2_bytes(device))
                for m in ms:
                    x = torch.randn(m, k, device=device, dtype=dtype)
                    cublas = time_per_call_us(lambda w: F.linear(x, w), copies, calls, replays)
                    want = F.linear(x, copies[0])
                    best: tuple[float, GemvConfig] | None = None
                    for cfg in candidate_configs(n, k, m, dtype.itemsize, num_sms):
                        try:
                            if not agrees(gemv(x, copies[0], None, cfg), want):
                                logger.warning("GEMV plan: %s disagrees with F.linear on (%d, %d) x %d rows; "
                                               "skipped", cfg.label(), n, k, m)
                                continue
                            us = time_per_call_us(lambda w: gemv(x, w, None, cfg), copies, calls, replays)
                        except Exception as e:  # a launch that does not fit this GPU (shared memory, registers)
                            logger.debug("GEMV plan: %s failed on (%d, %d) x %d: %s", cfg.label(), n, k, m, e)
                            continue
                        if best is None or us < best[0]:
                            best = (us, cfg)
                    use = best is not None and best[0] <= (1.0 - margin) * cublas
                    plan.choices[(n, k, m)] = GemvChoice(n, k, m, cublas, best and best[0], best and best[1], use)
                del copies
        torch.cuda.empty_cache()
        plan.seconds = time.perf_counter() - t0
        logger.info("GEMV plan measured in %.1f s:\n%s", plan.seconds, plan.summary())
        return plan

    def summary(self) -> str:
        lines = [f"{'N':>7} {'K':>6} {'M':>2} {'cuBLAS us':>10} {'Triton us':>10}  choice"]
        for (n, k, m), c in sorted(self.choices.items()):
            tri = f"{c.triton_us:10.2f}" if c.triton_us is not None else f"{'-':>10}"
            what = f"triton {c.config.label()}" if c.use_triton and c.config else "cuBLAS"
            lines.append(f"{n:>7} {k:>6} {m:>2} {c.cublas_us:10.2f} {tri}  {what}")
        return "\n".join(lines)
