"""Tiny safetensors models converted to F32 GGUF files in llama.cpp's layout, as ``convert_hf_to_gguf.py`` converts
them: its metadata keys, tensor names from gguf's own name map (``gguf.get_tensor_name_map``), and its layout
changes (Q/K rows, and their biases, permuted for ``llama``, Gemma's norms stored as ``1 + w``, experts stacked, gpt-oss's
interleaved gate/up split and its down projection transposed, the sinks given a ``.weight``). No tokenizer is
written: tests pass the folder's tokenizer."""

from __future__ import annotations

import re

import numpy as np
import torch

_PER_EXPERT = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<e>\d+)\.(?P<proj>\w+)\.weight$")


def _permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp's ``LlamaModel.permute``: HF's rotary halves to interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _rope_theta(config) -> float:
    params = getattr(config, "rope_parameters", None) or {}
    params = params.get("full_attention", params)
    return float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


def _hf_tensors(arch: str, model_dir: str, config):
    """The checkpoint's tensors after the converter's ``modify_tensors`` (HF names gguf's name map knows)."""
    from attnserve.model_executor.weights import safetensors_weights

    stacks: dict[str, dict[int, torch.Tensor]] = {}
    for name, t in safetensors_weights(model_dir):
        if arch in ("gemma2", "gemma3") and name == "lm_head.weight":
            continue
        if arch in ("gemma2", "gemma3") and name.endswith("norm.weight"):
            t = t + 1
        if arch == "llama" and name.endswith(("q_proj.weight", "q_proj.bias")):
            t = _permute(t, config.num_attention_heads)
        elif arch == "llama" and name.endswith(("k_proj.weight", "k_proj.bias")):
            t = _permute(t, config.num_key_value_heads)
        m = _PER_EXPERT.match(name)
        if m:  # stacked after the loop, in expert order
            stacks.setdefault(f"{m['prefix']}.{m['proj']}.weight", {})[int(m["e"])] = t
            continue
        if arch == "gpt-oss" and name.endswith("sinks"):
            yield name + ".weight", t
        elif arch == "gpt-oss" and name.endswith("experts.down_proj"):
            yield name + ".weight", t.transpose(-1, -2)
        elif arch == "gpt-oss" and name.endswith("experts.down_proj_bias"):
            yield name.replace("down_proj_bias", "down_proj.bias"), t
        elif arch == "gpt-oss" and name.endswith("experts.gate_up_proj"):
            t = t.transpose(-1, -2)  # (E, 2I, H), rows interleaved gate, up
            yield name.replace("gate_up_proj", "gate_proj.weight"), t[:, ::2]
            yield name.replace("gate_up_proj", "up_proj.weight"), t[:, 1::2]
        elif arch == "gpt-oss" and name.endswith("experts.gate_up_proj_bias"):
            yield name.replace("gate_up_proj_bias", "gate_proj.bias"), t[..., ::2]
            yield name.replace("gate_up_proj_bias", "up_proj.bias"), t[..., 1::2]
        else:
            yield name, t
    for name, experts in stacks.items():
        yield name, torch.stack([experts[e] for e in sorted(experts)])


def mxfp4_round(t: torch.Tensor) -> torch.Tensor:
    """``t`` through MXFP4 and back (blocks of 32 along the last dimension): values MXFP4 stores exactly."""
    import gguf
    from gguf import quants

    kind = gguf.GGMLQuantizationType.MXFP4
    return torch.from_numpy(quants.dequantize(quants.quantize(t.float().numpy(), kind), kind)).reshape(t.shape)


def write_gguf(model_dir: str, out_path: str, arch: str, mxfp4_experts: bool = False) -> str:
    """Convert the tiny model in ``model_dir`` to a GGUF of llama.cpp architecture ``arch`` (``llama`` for
    Mixtral, ``qwen3moe``, ``gemma2``, ``gemma3``, ``gpt-oss``) at ``out_path``; returns ``out_path``.
    ``mxfp4_experts``: the stacked expert weights stored as MXFP4 (as llama.cpp stores gpt-oss's)."""
    import gguf
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    model_arch = next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch)
    w = gguf.GGUFWriter(out_path, arch)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    w.add_block_count(config.num_hidden_layers)
    w.add_context_length(config.max_position_embeddings)
    w.add_embedding_length(config.hidden_size)
    w.add_feed_forward_length(config.intermediate_size)
    w.add_head_count(config.num_attention_heads)
    w.add_head_count_kv(config.num_key_value_heads)
    w.add_layer_norm_rms_eps(config.rms_norm_eps)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(_rope_theta(config))
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    experts = getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None)
    if experts:
        w.add_expert_count(experts)
        w.add_expert_used_count(config.num_experts_per_tok)
        w.add_expert_feed_forward_length(getattr(config, "moe_intermediate_size", None) or config.intermediate_size)
    if arch in ("gemma2", "gemma3", "gpt-oss"):
        w.add_sliding_window(config.sliding_window)
    if arch == "gemma2":
        w.add_attn_logit_softcapping(config.attn_logit_softcapping)
        w.add_final_logit_softcapping(config.final_logit_softcapping)
    if arch == "gemma3":
        full = config.rope_parameters["full_attention"]
        if full.get("rope_type") == "linear":
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(full["factor"])
    if arch == "gpt-oss":
        rope = config.rope_parameters
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    names = gguf.get_tensor_name_map(model_arch, config.num_hidden_layers)
    for name, tensor in _hf_tensors(arch, model_dir, config):
        new_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert new_name is not None, name
        data = np.ascontiguousarray(tensor.float().numpy())
        if mxfp4_experts and new_name.endswith("_exps.weight"):
            kind = gguf.GGMLQuantizationType.MXFP4
            w.add_tensor(new_name, gguf.quants.quantize(data, kind), raw_dtype=kind)
        else:
            w.add_tensor(new_name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out_path
