"""Async scheduling on the GPU, per installed backend with CUDA graphs, on the default model:

* the engine picks it by default on CUDA;
* a queued decode step (``ModelRunner.execute_async``: inputs, graph replay, sampling, the tokens' copy to
  the host) makes no synchronizing CUDA call (``torch.cuda.set_sync_debug_mode("error")``), so the host
  prepares the next step while the device runs this one;
* greedy tokens equal the synchronous engine's (the same steps run; async only reorders host work).
"""

from __future__ import annotations

import gc

import pytest
import torch

from attnserve import LLM, SamplingParams
from tests.gpu.test_cuda_graphs import CASES, _installed, default_gguf  # noqa: F401 (fixture)

pytestmark = pytest.mark.gpu

PROMPTS = ["The capital of France is", "def fibonacci(n):", "1, 2, 3, 4,", "Once upon a time"]
PARAMS = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)


def _checked_decode_steps(runner) -> list[int]:
    """Wrap ``runner.execute_async`` so every pure-decode step runs with CUDA sync debugging set to error."""
    checked = [0]
    queue = runner.execute_async

    def execute_async(sched):
        if sched.is_empty or any(len(r.token_ids) != 1 for r in sched.requests):
            return queue(sched)
        torch.cuda.set_sync_debug_mode("error")
        try:
            return queue(sched)
        finally:
            torch.cuda.set_sync_debug_mode("default")
            checked[0] += 1

    runner.execute_async = execute_async
    return checked


@pytest.mark.parametrize("label,backend,cfg,dtype,tol", CASES, ids=[c[0] for c in CASES])
def test_async_decode_steps_do_not_sync_and_match_sync(label, backend, cfg, dtype, tol, default_gguf):
    if not _installed(backend, cfg):
        pytest.skip(f"{label}: not installed")
    args = dict(
        dtype=dtype,
        device="cuda",
        attention_backend=backend,
        attention_config=cfg,
        kv_cache_memory=1 << 30,
        max_num_seqs=16,
    )
    llm = LLM(default_gguf, **args)
    assert llm.engine.async_scheduling is True
    checked = _checked_decode_steps(llm.engine.runner)
    before = llm.engine.runner.cuda_graphs.replays
    async_tokens = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, PARAMS)]
    assert checked[0] >= 31, f"{label}: only {checked[0]} decode steps checked"
    assert llm.engine.runner.cuda_graphs.replays - before >= 31
    del llm
    gc.collect()
    sync = LLM(default_gguf, async_scheduling=False, **args)
    assert [o.outputs[0].token_ids for o in sync.generate(PROMPTS, PARAMS)] == async_tokens
    del sync
    gc.collect()
    torch.cuda.empty_cache()
