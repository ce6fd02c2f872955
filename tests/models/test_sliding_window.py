"""Mistral v0.1's sliding window (tiny: 8 tokens) through the engine: chunked prefill, decode far past the window,
max_model_len beyond it, and the selector's reason for a backend without window support."""

from __future__ import annotations

import pytest
import torch

from attnserve import LLM, SamplingParams
from attnserve.attention.backends.cpu_attn import CPUAttentionBackend
from attnserve.attention.selector import AttentionSelectorConfig
from attnserve.platforms import detect_platform
from tests.helpers import hf_greedy
from tests.models.tiny import SLIDING_WINDOW

LONG_PROMPTS = [list(range(100, 130)), [7, 8, 9] * 7, list(range(2000, 2011))]  # 30, 21, 11 tokens: all > 8


@pytest.fixture(scope="module")
def hf_sw(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir("mistral_sw"), dtype=torch.float32).eval()


def test_window_changes_the_result(hf_sw, tiny_model_dir):
    """Guard for the other tests: the same weights without the window give other logits for a long prompt."""
    from transformers import AutoModelForCausalLM

    full = AutoModelForCausalLM.from_pretrained(tiny_model_dir("mistral_sw"), dtype=torch.float32, sliding_window=None)
    assert full.config.sliding_window is None
    windowed = hf_greedy(hf_sw, LONG_PROMPTS[0], 0)[1]
    assert (windowed - hf_greedy(full.eval(), LONG_PROMPTS[0], 0)[1]).abs().max().item() > 1e-2


@pytest.mark.parametrize("max_num_batched_tokens", [5, 13])
def test_chunked_prefill_and_decode_past_window(hf_sw, tiny_model_dir, max_num_batched_tokens):
    """Prompts split into chunks smaller and larger than the window, batched with other requests' decodes."""
    llm = LLM(
        tiny_model_dir("mistral_sw"),
        dtype="float32",
        device="cpu",
        block_size=4,
        kv_cache_memory=8 << 20,
        max_num_batched_tokens=max_num_batched_tokens,
        attention_backend="CPU_ATTN",
    )
    assert llm.engine.runner.selector_config.sliding_window == SLIDING_WINDOW
    assert {spec.sliding_window for spec in llm.engine.runner.layer_specs} == {SLIDING_WINDOW}
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    outs = llm.generate(LONG_PROMPTS, params)
    for prompt, out in zip(LONG_PROMPTS, outs):
        assert out.outputs[0].token_ids == hf_greedy(hf_sw, prompt, 20)[0]


def test_max_model_len_beyond_window(hf_sw, tiny_model_dir):
    """A context of 8x the window: 30 prompt tokens and 34 generated, max_model_len 64."""
    llm = LLM(
        tiny_model_dir("mistral_sw"),
        dtype="float32",
        device="cpu",
        block_size=4,
        kv_cache_memory=8 << 20,
        max_model_len=8 * SLIDING_WINDOW,
    )
    out = llm.generate(LONG_PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True))[0]
    tokens = out.outputs[0].token_ids
    assert len(LONG_PROMPTS[0]) + len(tokens) == 8 * SLIDING_WINDOW
    assert tokens == hf_greedy(hf_sw, LONG_PROMPTS[0], len(tokens))[0]


def test_backend_without_window_support_is_rejected_with_the_reason():
    class NoWindowBackend(CPUAttentionBackend):
        name = "NO_WINDOW"
        supports_sliding_window = False

    config = AttentionSelectorConfig(head_size=16, dtype=torch.float32, block_size=4, sliding_window=4096)
    assert NoWindowBackend.validate(config, detect_platform("cpu")) == ["sliding_window 4096 not supported"]
    assert CPUAttentionBackend.validate(config, detect_platform("cpu")) == []
