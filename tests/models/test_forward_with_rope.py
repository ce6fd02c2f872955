"""The RoPE models' attention layers call ``Attention.forward_with_rope`` (RoPE that also writes K/V into the
cache where the backend allows it; one kernel on CUDA): on CPU it must compute exactly what the path before
it did (RoPE, then ``Attention.forward``, whose backend writes K/V). Logits and KV caches bit for bit over
prefill, chunked prefill and decode steps, for a tiny Llama, Qwen3 (q/k norm) and Mistral (sliding window)."""

from __future__ import annotations

import pytest
import torch

from attnserve import LLM, SamplingParams
from attnserve.attention.layer import Attention
from attnserve.engine.scheduler import ScheduledRequest, SchedulerOutput
from attnserve.kernels.fused_ops import RopeInputs

PROMPT_A, PROMPT_B = [1, 520, 9553, 314, 4649, 30, 8800], [2, 44, 9000, 13, 77, 1200, 5, 6, 7, 8, 9]
BLOCKS_A, BLOCKS_B = [3, 0, 5], [1, 6, 2, 4]  # block size 4, in no particular order


def _steps() -> list[SchedulerOutput]:
    """A's prompt with B's first chunk; A's first decode with B's last chunk; a decode of each."""
    p = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    req = lambda rid, tokens, start, blocks, samples: ScheduledRequest(rid, tokens, start, blocks, p, samples)  # noqa: E731
    return [
        SchedulerOutput(requests=[req("a", PROMPT_A, 0, BLOCKS_A, True), req("b", PROMPT_B[:6], 0, BLOCKS_B, False)]),
        SchedulerOutput(requests=[req("a", [17], 7, BLOCKS_A, True), req("b", PROMPT_B[6:], 6, BLOCKS_B, True)]),
        SchedulerOutput(requests=[req("a", [99], 8, BLOCKS_A, True), req("b", [23], 11, BLOCKS_B, True)]),
    ]


def _run(llm: LLM) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    runner = llm.engine.runner
    for cache in runner.kv_caches:
        cache.zero_()
    logits = [runner.compute_logits(step) for step in _steps()]
    return logits, [cache.clone() for cache in runner.kv_caches]


def _unfused(self, query, key, value, batch, rope):
    """The layer before ``forward_with_rope``: RoPE in place, then the backend writes K/V and attends."""
    rope.apply(query, key)
    return self.forward(query, key, value, batch)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "mistral_sw"])
@pytest.mark.parametrize("backend", ["CPU_ATTN", "FLEX_ATTENTION"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_forward_with_rope_computes_what_rope_then_forward_did(arch, backend, dtype, tiny_model_dir, monkeypatch):
    llm = LLM(
        tiny_model_dir(arch),
        dtype=dtype,
        device="cpu",
        block_size=4,
        kv_cache_memory=8 << 20,
        attention_backend=backend,
    )
    calls = []
    fused_write = RopeInputs.apply_kv_write
    monkeypatch.setattr(RopeInputs, "apply_kv_write", lambda *a, **k: calls.append(1) or fused_write(*a, **k))
    logits, caches = _run(llm)
    assert len(calls) == 3 * llm.engine.runner.num_layers  # every layer of every step wrote K/V in the RoPE op
    monkeypatch.setattr(Attention, "forward_with_rope", _unfused)
    want_logits, want_caches = _run(llm)
    assert len(calls) == 3 * llm.engine.runner.num_layers
    for got, want in zip(logits + caches, want_logits + want_caches, strict=True):
        assert torch.equal(got, want)
    assert any(bool(c.any()) for c in caches)
