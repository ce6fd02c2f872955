"""Tiny random-weight Llama, Llama 3 (RoPE scaling, tied), Mistral (with and without its sliding window), Qwen2,
Qwen3, GPT-2, OPT (pre- and post-LayerNorm), Qwen3-MoE (dense and sparse layers), Mixtral (with and without a
sliding window) and gpt-oss (sinks, YaRN, biased clamped-SwiGLU experts; every layer full, every layer windowed, or alternating as published: two layer groups): tokens and logits vs transformers, float32 on CPU."""

from __future__ import annotations

import pytest

from attnserve import LLM, SamplingParams
from tests.helpers import hf_greedy, hf_reference

ARCHS = [
    "llama",
    "llama3",
    "mistral",
    "mistral_sw",
    "qwen2",
    "qwen3",
    "gpt2",
    "opt",
    "opt_post_ln",
    "qwen3_moe",
    "qwen3_moe_step2",
    "mixtral",
    "mixtral_sw",
    "gpt_oss",
    "gpt_oss_sw",
    "gpt_oss_mixed",
]
# the second prompt (19 tokens) and every generation (24 tokens) run past mistral_sw's and mixtral_sw's window of 8
PROMPTS = [
    [1, 520, 9553, 314, 4649, 30, 8800],
    [2, 44, 9000, 13, 77, 1200, 5, 6, 7, 8, 9, 10, 11, 12, 300, 301, 302, 303, 304],
    [15],
]


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_tokens_and_logits_match_transformers(arch, tiny_model_dir):
    path = tiny_model_dir(arch)
    hf = hf_reference(path)
    llm = LLM(path, dtype="float32", device="cpu", block_size=4, kv_cache_memory=8 << 20)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    outs = llm.generate(PROMPTS, params)
    for prompt, out in zip(PROMPTS, outs):
        ref_tokens, ref_logits = hf_greedy(hf, prompt, 24)
        assert out.outputs[0].token_ids == ref_tokens
    # logits of the prompt's last position, through the model runner
    from attnserve.engine.scheduler import ScheduledRequest, SchedulerOutput

    runner = llm.engine.runner
    reqs = [ScheduledRequest("a", PROMPTS[1], 0, list(range(5)), params, True)]
    logits = runner.compute_logits(SchedulerOutput(requests=reqs))[0]
    assert (logits - hf_greedy(hf, PROMPTS[1], 0)[1]).abs().max().item() < 1e-3
