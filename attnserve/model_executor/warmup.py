"""Mixed steps at start-up, so that kernels compiled on first use are compiled before the first request.

The memory profile runs one prefill step and the CUDA-graph capture runs decode steps alone; a step that holds
decodes and a prefill (continuous batching: a new request joins running ones) makes attention calls that neither
makes, and a backend whose kernels compile on first use (Triton's, FlashInfer's JIT) would compile them inside
the first such step of a run. TRITON_ATTN's mixed steps run a decode call over the decodes (unsplit when they fill
the GPU, else split-KV) and a prefill call: without this warm-up the first requests of ``bench throughput`` waited
for those compiles (TTFT p50 3.65 s against FLASH_ATTN's 0.28 s; docs/benchmarks.md, issue 28).

Two steps, each of ``WARMUP_PREFILL_TOKENS`` prompt tokens after the decodes: the most decodes a step can hold
(``max_num_seqs - 1``) and one decode, each at a context of ``WARMUP_CONTEXT`` tokens. Every request reads and
writes block 0 only (garbage, overwritten by its owner before any request reads it: no request exists yet).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from attnserve.core.sampling_params import SamplingParams
from attnserve.core.step import ScheduledRequest, SchedulerOutput

if TYPE_CHECKING:  # pragma: no cover
    from attnserve.model_executor.model_runner import ModelRunner

logger = logging.getLogger(__name__)

WARMUP_PREFILL_TOKENS = 16
WARMUP_CONTEXT = 1024  # tokens before a decode's new one (several KV tiles: the split-KV call at one decode)


def warmup_steps(max_num_seqs: int, max_num_batched_tokens: int, max_model_len: int, block_size: int):
    """The warm-up's steps: lists of ScheduledRequest (decodes first). Fewer decodes where the token budget or
    ``max_num_seqs`` holds fewer; none where a step cannot hold one decode and a prefill."""
    prefill = min(WARMUP_PREFILL_TOKENS, max_model_len)
    decodes = min(max_num_seqs - 1, max_num_batched_tokens - prefill)
    if decodes < 1:
        return []
    context = min(WARMUP_CONTEXT, max_model_len - 1)
    params = SamplingParams(temperature=0.0, max_tokens=1)
    steps = []
    for n in sorted({decodes, 1}, reverse=True):
        reqs = [
            ScheduledRequest(f"warmup-d{i}", [0], context, [0] * (context // block_size + 1), params, True)
            for i in range(n)
        ]
        reqs.append(ScheduledRequest("warmup-p", [0] * prefill, 0, [0] * -(-prefill // block_size), params, True))
        steps.append(reqs)
    return steps


def warm_up_mixed_steps(runner: ModelRunner) -> float:
    """Run :func:`warmup_steps` through ``runner`` (eagerly, as any mixed step); seconds spent. Frees the
    requests' block-table rows afterwards."""
    from attnserve.model_executor.loader import max_model_len_of

    sched = runner.config.scheduler
    t0 = time.perf_counter()
    max_len = max_model_len_of(runner.config.model, runner.hf_config)
    steps = warmup_steps(sched.max_num_seqs, sched.max_num_batched_tokens, max_len, runner.block_size)
    for reqs in steps:
        runner.compute_logits(SchedulerOutput(requests=reqs))
        runner.block_table_rows.release(r.request_id for r in reqs)
    seconds = time.perf_counter() - t0
    if steps:
        logger.info("Warm-up: %d mixed steps in %.1f s", len(steps), seconds)
    return seconds
