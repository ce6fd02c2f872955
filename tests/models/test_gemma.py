"""Tiny random-weight Gemma 2 (both soft caps, a window on even layers) and Gemma 3 text (2 local : 1 global,
q/k norms, a RoPE base per layer type): greedy tokens equal transformers' in float32 on CPU, on CPU_ATTN and
FLEX_ATTENTION, with prompts and generations past the window of 8, chunked prefill batched with decodes; the
layer groups and the backend each got."""

from __future__ import annotations

import pytest
import torch

from attnserve import LLM, SamplingParams
from attnserve.core.step import ScheduledRequest, SchedulerOutput
from tests.helpers import hf_greedy
from tests.models.tiny import SLIDING_WINDOW

# 30, 21, 11 and 1 tokens: all but the last past the window; 20 generated tokens take each past it
PROMPTS = [list(range(100, 130)), [7, 8, 9] * 7, list(range(2000, 2011)), [15]]
BACKENDS = ["CPU_ATTN", "FLEX_ATTENTION"]


@pytest.fixture(scope="module")
def hf_models(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return {
        arch: AutoModelForCausalLM.from_pretrained(tiny_model_dir(arch), dtype=torch.float32).eval()
        for arch in ("gemma2", "gemma3")
    }


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ["gemma2", "gemma3"])
def test_greedy_tokens_and_logits_match_transformers(arch, backend, hf_models, tiny_model_dir):
    hf = hf_models[arch]
    llm = LLM(
        tiny_model_dir(arch),
        dtype="float32",
        device="cpu",
        block_size=4,
        kv_cache_memory=8 << 20,
        max_num_batched_tokens=13,
        attention_backend=backend,
    )
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    for prompt, out in zip(PROMPTS, llm.generate(PROMPTS, params)):
        assert out.outputs[0].token_ids == hf_greedy(hf, prompt, 20)[0]
    reqs = [ScheduledRequest("a", PROMPTS[0], 0, list(range(8)), params, True)]
    logits = llm.engine.runner.compute_logits(SchedulerOutput(requests=reqs))[0]
    assert (logits - hf_greedy(hf, PROMPTS[0], 0)[1]).abs().max().item() < 1e-3


def test_window_and_soft_caps_change_the_result(hf_models, tiny_model_dir):
    """Guard for the test above: without the window or the attention soft cap the logits differ."""
    from transformers import AutoModelForCausalLM

    ref = hf_greedy(hf_models["gemma2"], PROMPTS[0], 0)[1]
    for change in ({"sliding_window": 4096}, {"attn_logit_softcapping": None}):
        other = AutoModelForCausalLM.from_pretrained(tiny_model_dir("gemma2"), dtype=torch.float32, **change).eval()
        assert (hf_greedy(other, PROMPTS[0], 0)[1] - ref).abs().max().item() > 1e-2, change


@pytest.mark.parametrize(
    "arch,groups",
    [
        ("gemma2", [((0, 2), SLIDING_WINDOW), ((1, 3), None)]),
        ("gemma3", [((0, 1, 3, 4), SLIDING_WINDOW), ((2, 5), None)]),
    ],
)
def test_layer_groups_each_get_a_backend(arch, groups, tiny_model_dir, caplog):
    caplog.set_level("INFO", logger="attnserve.model_executor.model_runner")
    llm = LLM(tiny_model_dir(arch), dtype="float32", device="cpu", block_size=4, kv_cache_memory=8 << 20)
    runner = llm.engine.runner
    got = [(g.layers, g.kind.sliding_window, g.selection.name, g.kind.logits_soft_cap) for g in runner.attention.groups]
    cap = 5.0 if arch == "gemma2" else None
    assert got == [(layers, window, "CPU_ATTN", cap) for layers, window in groups]
    assert [spec.sliding_window for spec in runner.layer_specs] == [
        next(w for layers, w in groups if i in layers) for i in range(len(runner.layer_specs))
    ]
    assert llm.engine.info.backend_name == "CPU_ATTN"
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("Attention layer groups"))
    assert line.count("CPU_ATTN") == 2 and "layer group 1" in line


def test_explicit_backend_that_cannot_serve_a_group_names_it(tiny_model_dir):
    """A backend without soft-cap support, chosen explicitly: refused at start-up naming the first group it
    cannot serve and the backends that would serve it."""
    from attnserve.attention.backends.cpu_attn import CPUAttentionBackend
    from attnserve.attention.registry import register_backend, unregister_backend
    from attnserve.attention.selector import NoUsableBackendError

    class NoCapBackend(CPUAttentionBackend):
        name = "CUSTOM"
        supports_logits_soft_cap = False

    register_backend("CUSTOM", NoCapBackend)
    try:
        with pytest.raises(NoUsableBackendError) as e:
            LLM(
                tiny_model_dir("gemma2"),
                dtype="float32",
                device="cpu",
                block_size=4,
                kv_cache_memory=8 << 20,
                attention_backend="CUSTOM",
            )
    finally:
        unregister_backend("CUSTOM")
    assert e.value.reasons == {"CUSTOM": ["logits_soft_cap 5.0 not supported"]}
    assert "layer group 0 (layers 0, 2: head_size 32, sliding_window 8, logits_soft_cap 5.0)" in str(e.value)
    assert "Backends that would work: CPU_ATTN, FLEX_ATTENTION." in str(e.value)
