"""GGUF loading of non-Llama architectures: a tiny GPT-2 converted to GGUF in llama.cpp's layout (F32) loads
into the same parameters as its safetensors and gives transformers' greedy tokens and logits."""

from __future__ import annotations

import torch

from attnserve import LLM, SamplingParams
from attnserve.engine.scheduler import ScheduledRequest, SchedulerOutput
from tests.helpers import hf_greedy
from tests.models.tiny import write_gpt2_gguf

PROMPTS = [[2, 44, 9000, 13, 77, 1200, 5, 6, 7, 8, 9, 10, 11, 12, 300, 301, 302, 303, 304], [15, 16]]


def test_gpt2_gguf_matches_safetensors_and_transformers(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    folder = tiny_model_dir("gpt2")
    gguf_path = write_gpt2_gguf(folder, str(tmp_path / "tiny-gpt2-f32.gguf"))
    kwargs = dict(dtype="float32", device="cpu", block_size=4, kv_cache_memory=8 << 20)
    from_gguf = LLM(gguf_path, tokenizer=folder, **kwargs)
    from_st = LLM(folder, **kwargs)
    gguf_params = dict(from_gguf.engine.runner.model.named_parameters())
    for name, p in from_st.engine.runner.model.named_parameters():
        assert torch.equal(gguf_params[name], p), name

    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    for prompt, out in zip(PROMPTS, from_gguf.generate(PROMPTS, params)):
        assert out.outputs[0].token_ids == hf_greedy(hf, prompt, 16)[0]
    reqs = [ScheduledRequest("a", PROMPTS[0], 0, list(range(5)), params, True)]
    logits = from_gguf.engine.runner.compute_logits(SchedulerOutput(requests=reqs))[0]
    assert (logits - hf_greedy(hf, PROMPTS[0], 0)[1]).abs().max().item() < 1e-3
