"""How much GPU memory one step's activations need, measured once at start-up, so that the KV cache leaves it free."""

from __future__ import annotations

import logging
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from attnserve.model_executor.model_runner import ModelRunner

logger = logging.getLogger("attnserve.model_executor.model_runner")  # the runner's start-up log


def activation_reserve_bytes(runner: ModelRunner) -> int:
    """Peak activation memory of one step, kept free of KV cache on GPU.

    Measured (GPU memory profiling): one forward pass of ``max_num_batched_tokens`` dummy tokens on a
    temporary cache just big enough for them, peak minus what was allocated before, plus the
    sampler's float32 logits for ``max_num_seqs`` requests. Skipped (0) when the cache size is given
    explicitly. On CPU it returns 0 after the same step over one block's tokens, measuring nothing: the
    runner's start-up then takes the path a GPU's does, so CPU tests catch state read before it is set.
    """
    if runner.device.type != "cuda":
        _profile_step(runner, runner.block_size, nullcontext)
        return 0
    cache = runner.config.cache
    if cache.num_gpu_blocks is not None or cache.kv_cache_memory is not None:
        return 0
    sched = runner.config.scheduler
    tokens = min(sched.max_num_batched_tokens, getattr(runner.hf_config, "max_position_embeddings", None) or 1 << 30)
    peak = [0]
    _profile_step(runner, tokens, lambda: _peak_bytes(runner.device, peak))
    torch.cuda.empty_cache()
    logits = sched.max_num_seqs * runner.dims.vocab_size * 4 * 3
    logger.info("Profiled one step of %d tokens: %.1f MiB of activations", tokens, peak[0] / 2**20)
    return peak[0] + logits + (256 << 20)


def _profile_step(runner: ModelRunner, tokens: int, measure) -> None:
    """One prefill of ``tokens`` dummy tokens on a temporary cache just big enough for them, the forward pass
    inside ``measure()`` (a context manager), the cache released afterwards."""
    from attnserve.core.sampling_params import SamplingParams
    from attnserve.core.step import ScheduledRequest, SchedulerOutput

    n_blocks = -(-tokens // runner.block_size)
    runner.kv_caches = runner._allocate(n_blocks + 1)
    req = ScheduledRequest(
        "profile", [0] * tokens, 0, list(range(1, n_blocks + 1)), SamplingParams(temperature=0.0, max_tokens=1), True
    )
    with measure():
        runner.compute_logits(SchedulerOutput(requests=[req]))
    runner.kv_caches = []


@contextmanager
def _peak_bytes(device: torch.device, out: list[int]):
    """``out[0]``: the peak bytes allocated on ``device`` inside the block, above what was allocated before it."""
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    yield
    torch.cuda.synchronize(device)
    out[0] = torch.cuda.max_memory_allocated(device) - before
