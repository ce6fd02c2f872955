"""How much GPU memory one step's activations need, measured once at start-up, so that the KV cache leaves it free."""

from __future__ import annotations

import logging
from contextlib import contextmanager
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
        with _profile_step(runner, runner.block_size) as step:
            runner.compute_logits(step)
        return 0
    cache = runner.config.cache
    if cache.num_gpu_blocks is not None or cache.kv_cache_memory is not None:
        return 0
    sched = runner.config.scheduler
    tokens = min(sched.max_num_batched_tokens, getattr(runner.hf_config, "max_position_embeddings", None) or 1 << 30)
    with _profile_step(runner, tokens) as step:
        torch.cuda.synchronize(runner.device)
        before = torch.cuda.memory_allocated(runner.device)
        torch.cuda.reset_peak_memory_stats(runner.device)
        runner.compute_logits(step)
        torch.cuda.synchronize(runner.device)
        peak = torch.cuda.max_memory_allocated(runner.device) - before
    torch.cuda.empty_cache()
    logits = sched.max_num_seqs * runner.dims.vocab_size * 4 * 3
    logger.info("Profiled one step of %d tokens: %.1f MiB of activations", tokens, peak / 2**20)
    return peak + logits + (256 << 20)


@contextmanager
def _profile_step(runner: ModelRunner, tokens: int):
    """The step of one prefill of ``tokens`` dummy tokens, on a temporary cache just big enough for them that
    the runner holds inside the block; after it the cache and the request's block-table row are released."""
    from attnserve.core.sampling_params import SamplingParams
    from attnserve.core.step import ScheduledRequest, SchedulerOutput

    n_blocks = -(-tokens // runner.block_size)
    runner.kv_caches = runner._allocate(n_blocks + 1)
    req = ScheduledRequest(
        "profile", [0] * tokens, 0, list(range(1, n_blocks + 1)), SamplingParams(temperature=0.0, max_tokens=1), True
    )
    try:
        yield SchedulerOutput(requests=[req])
    finally:
        runner.kv_caches = []
        runner.block_table_rows.release([req.request_id])
