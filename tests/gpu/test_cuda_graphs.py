"""CUDA graphs on the GPU: decode steps replay captured graphs and compute what eager steps compute.

For each installed backend that declares CUDA-graph support, on the default model (real weights):
* a decode step of 3 requests (padded to the 4-request bucket) gives the same logits replayed as eagerly:
  identical in float32 for TRITON_ATTN, within 16-bit rounding for the others (padding changes the matmul
  shapes cuBLAS picks kernels for, so 16-bit sums may round differently);
* ``generate`` replays graphs for its decode steps and, in float32, gives the eager engine's tokens.
"""

from __future__ import annotations

import gc

import pytest
import torch

from attnserve import LLM, SamplingParams
from attnserve.engine.scheduler import ScheduledRequest, SchedulerOutput
from tests.gpu.backends import _has

pytestmark = pytest.mark.gpu

GREEDY = SamplingParams(temperature=0.0, max_tokens=1)
PROMPTS = ["The capital of France is", "def fibonacci(n):", "1, 2, 3, 4,"]

CASES = [  # (label, backend, attention_config, dtype, relative tolerance of the decode logits)
    ("TRITON_ATTN fp32", "TRITON_ATTN", {}, "float32", 1e-5),
    ("TRITON_ATTN bf16", "TRITON_ATTN", {}, "bfloat16", 2e-2),
    ("FLASH_ATTN/3 bf16", "FLASH_ATTN", {"flash_attn_version": 3}, "bfloat16", 2e-2),
    ("FLASH_ATTN/4 bf16", "FLASH_ATTN", {"flash_attn_version": 4}, "bfloat16", 2e-2),
    ("FLASHINFER bf16", "FLASHINFER", {}, "bfloat16", 2e-2),
]


def _installed(backend: str, cfg: dict) -> bool:
    """The package the backend (or FlashAttention version) declares is importable here."""
    if backend == "FLASH_ATTN":
        from attnserve.attention.backends.flash_attn import FLASH_ATTN_VERSIONS

        return _has(FLASH_ATTN_VERSIONS[cfg["flash_attn_version"]].package)
    from attnserve.attention.registry import get_backend_class, lookup_backend

    return _has(get_backend_class(lookup_backend(backend)).required_package)


@pytest.fixture(scope="module")
def default_gguf():
    from attnserve.model_executor.loader import resolve_model_source

    return resolve_model_source(None).path


@pytest.mark.parametrize("label,backend,cfg,dtype,tol", CASES, ids=[c[0] for c in CASES])
def test_decode_graph_matches_eager(label, backend, cfg, dtype, tol, default_gguf):
    if not _installed(backend, cfg):
        pytest.skip(f"{label}: not installed")
    llm = LLM(default_gguf, dtype=dtype, device="cuda", attention_backend=backend, attention_config=cfg,
              kv_cache_memory=1 << 30, max_num_seqs=64)
    runner = llm.engine.runner
    assert runner.cuda_graphs is not None, f"{label}: no CUDA graphs captured"
    assert runner.cuda_graphs.sizes == [1, 2, 4, 8, 16, 32, 48, 64]
    prompts = [llm.tokenizer.encode(p) for p in PROMPTS]
    # prefill each prompt (eager), then one decode step of all three: graph replay vs eager
    tables = [[10 * i + j for j in range(4)] for i in range(len(prompts))]
    for i, p in enumerate(prompts):
        runner.compute_logits(SchedulerOutput([ScheduledRequest(f"r{i}", p, 0, tables[i], GREEDY, True)]))
    step = SchedulerOutput([ScheduledRequest(f"r{i}", [42 + i], len(p), tables[i], GREEDY, True)
                            for i, p in enumerate(prompts)])
    before = runner.cuda_graphs.replays
    graph_logits = runner.compute_logits(step).float().cpu()
    assert runner.cuda_graphs.replays == before + 1
    graphs, runner.cuda_graphs = runner.cuda_graphs, None
    eager_logits = runner.compute_logits(step).float().cpu()
    runner.cuda_graphs = graphs
    err = ((graph_logits - eager_logits).abs().max() / eager_logits.abs().max()).item()
    print(f"{label}: decode logits graph vs eager, max relative difference {err:.2e}")
    assert not torch.isnan(graph_logits).any()
    assert err <= tol, f"{label}: {err:.2e} > {tol}"
    # end to end: generate replays graphs; float32 tokens equal the eager engine's
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    toks = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]
    assert runner.cuda_graphs.replays > before + 20
    del llm
    gc.collect()
    if dtype == "float32":
        eager = LLM(default_gguf, dtype=dtype, device="cuda", attention_backend=backend, attention_config=cfg,
                    kv_cache_memory=1 << 30, enforce_eager=True)
        assert eager.engine.runner.cuda_graphs is None
        assert [o.outputs[0].token_ids for o in eager.generate(PROMPTS, params)] == toks
        del eager
    torch.cuda.empty_cache()


def test_flex_attention_runs_eagerly_with_reason(default_gguf, caplog):
    import logging

    caplog.set_level(logging.INFO, logger="attnserve.model_executor.model_runner")
    llm = LLM(default_gguf, dtype="float32", device="cuda", attention_backend="FLEX_ATTENTION",
              kv_cache_memory=1 << 30)
    assert llm.engine.runner.cuda_graphs is None
    assert "CUDA graphs off: FLEX_ATTENTION declares no CUDA-graph support" in caplog.text
