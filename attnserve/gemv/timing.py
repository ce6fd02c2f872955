"""How ``GemvPlan`` and the GEMV benchmarks time a linear layer: as a decode step would see it.

Each measurement is one CUDA graph of back-to-back calls cycling through copies of the weight whose total
exceeds twice the L2 cache (in a real step the rest of the model has passed through L2 in between), timed
with CUDA events over several replays; every candidate is first checked against ``F.linear``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable

import torch

if TYPE_CHECKING:
    from attnserve.kernels.triton_gemv import GemvConfig

logger = logging.getLogger("attnserve.gemv")  # the plan's log: its candidates are skipped here


def l2_bytes(device: torch.device) -> int:
    return int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 << 20))


def weight_copies(weight: torch.Tensor, min_bytes: int) -> list[torch.Tensor]:
    """``weight`` and random copies of it until their bytes reach ``min_bytes`` (at least one: itself)."""
    size = weight.numel() * weight.element_size()
    copies = [weight]
    while len(copies) * size < min_bytes:
        copies.append(torch.randn_like(weight))
    return copies


def time_per_call_us(
    call: Callable[[torch.Tensor], object], weights: list[torch.Tensor], calls: int = 20, replays: int = 10
) -> float:
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


def time_candidates(
    call: Callable[[torch.Tensor, GemvConfig], torch.Tensor],
    want: torch.Tensor,
    copies: list[torch.Tensor],
    n: int,
    k: int,
    m: int,
    configs: list[GemvConfig],
    calls: int,
    replays: int,
) -> list[tuple[float, GemvConfig]]:
    """(microseconds, config) of each config whose ``call(weight, config)`` agrees with ``want`` on the first
    copy; a config that disagrees is logged and skipped, one that fails to launch (shared memory, registers
    of this GPU) skipped."""
    timed = []
    for cfg in configs:
        try:
            if not agrees(call(copies[0], cfg), want):
                logger.warning(
                    "GEMV plan: %s disagrees with F.linear on (%d, %d) x %d rows; skipped", cfg.label(), n, k, m
                )
                continue
            timed.append((time_per_call_us(lambda w: call(w, cfg), copies, calls, replays), cfg))
        except Exception as e:  # a launch that does not fit this GPU
            logger.debug("GEMV plan: %s failed on (%d, %d) x %d: %s", cfg.label(), n, k, m, e)
    return timed
