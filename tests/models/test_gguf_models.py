"""GGUF loading of non-Llama architectures: tiny GPT-2, Gemma 2 and 3, Qwen3-MoE, Mixtral and gpt-oss models
converted to GGUF in llama.cpp's layout (F32) load into the same parameters as their safetensors and give
transformers' greedy tokens; so does a Llama with attention and MLP biases. An architecture without a tensor
mapping, and a bias tensor its config cannot say, are refused naming them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnserve import LLM, SamplingParams
from attnserve.engine.scheduler import ScheduledRequest, SchedulerOutput
from tests.helpers import hf_greedy
from tests.models.gguf_writer import mxfp4_round, write_gguf
from tests.models.tiny import make_tiny_model, write_gpt2_gguf

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


# architecture -> (llama.cpp architecture, config changes for what llama.cpp's GGUF cannot say otherwise)
GGUF_CASES = {
    "gemma2": ("gemma2", dict(query_pre_attn_scalar=32)),  # llama.cpp: the head size (but for the 27B)
    "gemma3": (
        "gemma3",
        dict(
            query_pre_attn_scalar=32,
            sliding_window_pattern=6,  # llama.cpp's 5 local : 1 global
            layer_types=["sliding_attention"] * 5 + ["full_attention"],
        ),
    ),
    "qwen3_moe": ("qwen3moe", dict(mlp_only_layers=[], decoder_sparse_step=1)),  # gguf maps no dense FFN here
    "mixtral": ("llama", {}),
    "gpt_oss_mixed": ("gpt-oss", dict(swiglu_limit=7.0)),  # GGUF stores no limit: llama.cpp's 7
}


@pytest.mark.parametrize("arch", list(GGUF_CASES))
def test_gguf_matches_safetensors_and_transformers(arch, default_tokenizer, tmp_path):
    """A tiny model converted as llama.cpp converts it loads into the safetensors load's parameters (within
    float32 rounding: Gemma's norms go through 1 + w) and gives its greedy tokens and transformers'."""
    from transformers import AutoModelForCausalLM

    gguf_arch, changes = GGUF_CASES[arch]
    folder = make_tiny_model(arch, tmp_path / "st", default_tokenizer, **changes)
    gguf_path = write_gguf(folder, str(tmp_path / f"tiny-{arch}-f32.gguf"), gguf_arch)
    kwargs = dict(dtype="float32", device="cpu", block_size=4, kv_cache_memory=8 << 20)
    from_gguf = LLM(gguf_path, tokenizer=folder, **kwargs)
    from_st = LLM(folder, **kwargs)
    assert type(from_gguf.engine.runner.model) is type(from_st.engine.runner.model)
    gguf_params = dict(from_gguf.engine.runner.model.named_parameters())
    st_params = dict(from_st.engine.runner.model.named_parameters())
    assert gguf_params.keys() == st_params.keys()
    for name, p in st_params.items():
        assert torch.allclose(gguf_params[name], p, rtol=0, atol=1e-6), name

    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    got = [o.outputs[0].token_ids for o in from_gguf.generate(PROMPTS, params)]
    assert got == [o.outputs[0].token_ids for o in from_st.generate(PROMPTS, params)]
    assert got == [hf_greedy(hf, p, 12)[0] for p in PROMPTS]


def test_gpt_oss_gguf_with_mxfp4_experts(default_tokenizer, tmp_path):
    """gpt-oss as llama.cpp publishes it: expert weights in MXFP4, dequantized at load. The safetensors model's
    experts are first rounded to values MXFP4 holds exactly (in the GGUF layout: blocks along H for gate/up,
    along I for down), so the GGUF must give the same tokens as that model and transformers."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    gguf_arch, changes = GGUF_CASES["gpt_oss_mixed"]
    folder = make_tiny_model("gpt_oss_mixed", tmp_path / "st", default_tokenizer, **changes)
    file = str(tmp_path / "st" / "model.safetensors")
    tensors = load_file(file)
    for name, t in tensors.items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):  # (E, H, 2I) / (E, I, H)
            tensors[name] = mxfp4_round(t.transpose(1, 2)).transpose(1, 2).contiguous()
    save_file(tensors, file, metadata={"format": "pt"})
    gguf_path = write_gguf(folder, str(tmp_path / "tiny-gpt-oss-mxfp4.gguf"), gguf_arch, mxfp4_experts=True)
    import gguf

    from attnserve.model_executor.weights import gguf_reader

    kinds = {t.name: t.tensor_type for t in gguf_reader(gguf_path).tensors}
    assert kinds["blk.0.ffn_gate_exps.weight"] == kinds["blk.1.ffn_down_exps.weight"] == gguf.GGMLQuantizationType.MXFP4

    kwargs = dict(dtype="float32", device="cpu", block_size=4, kv_cache_memory=8 << 20)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    from_gguf, from_st = LLM(gguf_path, tokenizer=folder, **kwargs), LLM(folder, **kwargs)
    gguf_params = dict(from_gguf.engine.runner.model.named_parameters())
    for name, p in from_st.engine.runner.model.named_parameters():
        if ".experts." in name:  # the dequantized MXFP4 blocks: exactly the rounded weights
            assert torch.equal(gguf_params[name], p), name
    got = [o.outputs[0].token_ids for o in from_gguf.generate(PROMPTS, params)]
    assert got == [o.outputs[0].token_ids for o in from_st.generate(PROMPTS, params)]
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    assert got == [hf_greedy(hf, p, 12)[0] for p in PROMPTS]


def test_gguf_architecture_without_a_mapping_is_refused(tmp_path):
    """A GGUF of an architecture attnserve maps no tensors for: refused naming general.architecture and its
    value, before transformers' conversion."""
    import gguf

    from attnserve.refusals import Refused

    path = str(tmp_path / "tiny-qwen2moe.gguf")
    w = gguf.GGUFWriter(path, "qwen2moe")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(Refused) as e:
        LLM(path, dtype="float32", device="cpu")
    assert (e.value.refusal.path, e.value.refusal.value) == (("general.architecture",), "qwen2moe")
    assert "gemma2" in e.value.refusal.allowed and "gpt-oss" in e.value.refusal.allowed


def test_llama_gguf_with_biases_loads_them(default_tokenizer, tmp_path):
    """A Llama with q/k/v/o and gate/up/down biases (llama.cpp loads each bias it finds; q/k biases permuted
    like their rows): the config gets attention_bias and mlp_bias from the tensors, the biases load into the
    safetensors load's parameters, and tokens and logits are transformers'."""
    from transformers import AutoModelForCausalLM

    folder = make_tiny_model("llama", tmp_path / "st", default_tokenizer, attention_bias=True, mlp_bias=True)
    gguf_path = write_gguf(folder, str(tmp_path / "tiny-llama-bias-f32.gguf"), "llama")
    kwargs = dict(dtype="float32", device="cpu", block_size=4, kv_cache_memory=8 << 20)
    from_gguf, from_st = LLM(gguf_path, tokenizer=folder, **kwargs), LLM(folder, **kwargs)
    hf_config = from_gguf.engine.runner.model.config
    assert (hf_config.attention_bias, hf_config.mlp_bias) == (True, True)
    gguf_params = dict(from_gguf.engine.runner.model.named_parameters())
    st_params = dict(from_st.engine.runner.model.named_parameters())
    assert gguf_params.keys() == st_params.keys()
    assert {"layers.0.self_attn.qkv_proj.bias", "layers.1.mlp.down_proj.bias"} <= gguf_params.keys()
    for name, p in st_params.items():
        assert torch.equal(gguf_params[name], p), name

    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    got = [o.outputs[0].token_ids for o in from_gguf.generate(PROMPTS, params)]
    assert got == [hf_greedy(hf, p, 12)[0] for p in PROMPTS]
    reqs = [ScheduledRequest("a", PROMPTS[0], 0, list(range(5)), params, True)]
    logits = from_gguf.engine.runner.compute_logits(SchedulerOutput(requests=reqs))[0]
    assert (logits - hf_greedy(hf, PROMPTS[0], 0)[1]).abs().max().item() < 1e-4


def test_bias_the_config_cannot_say_is_refused_naming_the_tensor(default_tokenizer, tmp_path):
    """A qwen2 GGUF with an o_proj bias (Qwen2Config has no attention_bias: transformers' Qwen2 has none either):
    refused before the weights load, naming the first such tensor."""
    from attnserve.refusals import Refused

    folder = make_tiny_model("llama", tmp_path / "st", default_tokenizer, attention_bias=True)
    gguf_path = write_gguf(folder, str(tmp_path / "tiny-qwen2-o-bias.gguf"), "qwen2")
    with pytest.raises(Refused) as e:
        LLM(gguf_path, tokenizer=folder, dtype="float32", device="cpu", kv_cache_memory=8 << 20)
    assert e.value.refusal.path == ("blk.0.attn_output.bias",)
    assert str(e.value) == (
        f"GGUF {gguf_path}: tensor 'blk.0.attn_output.bias' not supported: Qwen2Config (GGUF architecture qwen2) "
        "has no bias there"
    )
