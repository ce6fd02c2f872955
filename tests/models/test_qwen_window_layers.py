"""Qwen2 and Qwen3 with ``use_sliding_window``: only the layers ``config.layer_types`` calls ``sliding_attention``
(transformers: index >= ``max_window_layers``) have the window. Tiny models (2 layers, window 8 on layer 1 only):
logits and greedy tokens equal transformers' in float32, with prompts and generations past the window; the two
layer groups and their backends; the rule's fallbacks for configs without ``layer_types``."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from attnserve import LLM, SamplingParams
from attnserve.core.step import ScheduledRequest, SchedulerOutput
from attnserve.models.dims import LayerAttention
from attnserve.models.qwen import Qwen2ForCausalLM, Qwen3ForCausalLM
from attnserve.models.qwen3_moe import Qwen3MoeForCausalLM
from tests.helpers import hf_greedy, hf_reference
from tests.models.tiny import SLIDING_WINDOW

ARCHS = ["qwen2_sw", "qwen3_sw"]
# 20, 21, 11 and 1 tokens: all but the last past the window; 16 generated tokens take each past it
PROMPTS = [list(range(300, 320)), [7, 8, 9] * 7, list(range(2000, 2011)), [15]]


@pytest.fixture(scope="module")
def hf_models(tiny_model_dir):
    return {arch: hf_reference(tiny_model_dir(arch)) for arch in ARCHS}


def _llm(path, **kw) -> LLM:
    return LLM(path, dtype="float32", device="cpu", block_size=4, kv_cache_memory=8 << 20, **kw)


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_and_greedy_tokens_match_transformers(arch, hf_models, tiny_model_dir):
    hf = hf_models[arch]
    assert hf.config.layer_types == ["full_attention", "sliding_attention"]
    llm = _llm(tiny_model_dir(arch), max_num_batched_tokens=13)
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    for prompt, out in zip(PROMPTS, llm.generate(PROMPTS, params)):
        assert out.outputs[0].token_ids == hf_greedy(hf, prompt, 16)[0]
    reqs = [ScheduledRequest("a", PROMPTS[0], 0, list(range(5)), params, True)]
    logits = llm.engine.runner.compute_logits(SchedulerOutput(requests=reqs))[0]
    assert (logits - hf_greedy(hf, PROMPTS[0], 0)[1]).abs().max().item() < 1e-4


def test_which_layers_slide_changes_the_result(hf_models, tiny_model_dir):
    """Guard for the test above: the same weights with the window on every layer, or on none, give other logits
    (``layer_types`` given: transformers sets a from_pretrained override after the config's own derivation)."""
    from transformers import AutoModelForCausalLM

    ref = hf_greedy(hf_models["qwen2_sw"], PROMPTS[0], 0)[1]
    for change in ({"layer_types": ["sliding_attention"] * 2}, {"layer_types": ["full_attention"] * 2}):
        other = AutoModelForCausalLM.from_pretrained(
            tiny_model_dir("qwen2_sw"), dtype=torch.float32, attn_implementation="eager", **change
        ).eval()
        assert (hf_greedy(other, PROMPTS[0], 0)[1] - ref).abs().max().item() > 1e-2, change


@pytest.mark.parametrize("arch", ARCHS)
def test_windowed_and_full_layers_are_two_groups(arch, tiny_model_dir):
    runner = _llm(tiny_model_dir(arch)).engine.runner
    got = [(g.layers, g.kind.sliding_window, g.selection.name) for g in runner.attention.groups]
    assert got == [((0,), None, "CPU_ATTN"), ((1,), SLIDING_WINDOW, "CPU_ATTN")]
    assert [spec.sliding_window for spec in runner.layer_specs] == [None, SLIDING_WINDOW]


def test_backend_without_window_support_is_refused_for_the_windowed_group(tiny_model_dir):
    from attnserve.attention.backends.cpu_attn import CPUAttentionBackend
    from attnserve.attention.registry import register_backend, unregister_backend
    from attnserve.attention.selector import NoUsableBackendError

    class NoWindowBackend(CPUAttentionBackend):
        name = "CUSTOM"
        supports_sliding_window = False

    register_backend("CUSTOM", NoWindowBackend)
    try:
        with pytest.raises(NoUsableBackendError) as e:
            _llm(tiny_model_dir("qwen2_sw"), attention_backend="CUSTOM")
    finally:
        unregister_backend("CUSTOM")
    assert e.value.reasons == {"CUSTOM": [f"sliding_window {SLIDING_WINDOW} not supported"]}
    assert f"layer group 1 (layer 1: head_size 16, sliding_window {SLIDING_WINDOW})" in str(e.value)


def _config(**fields) -> SimpleNamespace:
    base = dict(
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        hidden_size=64,
        intermediate_size=128,
        vocab_size=100,
        sliding_window=8,
    )
    return SimpleNamespace(**{**base, **fields})


@pytest.mark.parametrize(
    "fields,windows",
    [
        ({"layer_types": ["sliding_attention", "full_attention"] * 2}, (8, None, 8, None)),
        ({"max_window_layers": 3}, (None, None, None, 8)),  # no layer_types: transformers' derivation
        ({}, (8, 8, 8, 8)),  # neither: the one window on every layer
        ({"use_sliding_window": False, "layer_types": ["sliding_attention"] * 4}, (None,) * 4),
        ({"use_sliding_window": True, "max_window_layers": 0}, (8,) * 4),
    ],
)
def test_dims_give_each_layer_its_window(fields, windows):
    for cls in (Qwen2ForCausalLM, Qwen3ForCausalLM):
        assert tuple(k.sliding_window for k in cls.dims(_config(**fields)).layer_attention()) == windows


def test_qwen3_moe_windows_every_layer():
    """transformers' Qwen3-MoE has no layer_types and reads no max_window_layers: the window is on every layer."""
    config = _config(max_window_layers=3, num_experts=4, use_sliding_window=True)
    assert Qwen3MoeForCausalLM.dims(config).layer_attention() == (LayerAttention(16, 8),) * 4
