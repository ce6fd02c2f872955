"""GGUF architectures attnserve reads: tensor names back to Hugging Face's, and the config completed from the
metadata that transformers' GGUF conversion leaves out.

llama.cpp's converter (``convert_hf_to_gguf.py``) names tensors by gguf's tensor name map
(``gguf.get_tensor_name_map``) and changes some layouts; :func:`hf_tensors` undoes both, per
``general.architecture``:

* ``llama`` / ``mistral``: Q and K rows permuted to llama.cpp's interleaved RoPE (undone, :func:`unpermute_qk`);
  with ``llama.expert_count`` > 0 the file is a Mixtral (router ``ffn_gate_inp``, experts stacked).
* ``qwen2``, ``qwen3``: the Llama names, no permutation.
* ``qwen3moe``: Qwen3's attention, router ``ffn_gate_inp``, experts stacked in ``ffn_{gate,up,down}_exps``
  (every layer sparse: gguf maps no dense FFN for this architecture).
* ``gemma2``, ``gemma3``: four norms per layer (``attn_norm``, ``post_attention_norm``, ``ffn_norm`` = the
  pre-feedforward norm, ``post_ffw_norm``), every ``*norm.weight`` stored as ``1 + w`` (the offset is taken back).
* ``gpt-oss``: ``attn_sinks.weight`` (HF ``self_attn.sinks``), ``post_attention_norm``, router ``ffn_gate_inp`` with
  a bias, experts with biases, gate and up split (HF interleaves them; ``ffn_gate_up_exps``: gate rows, then up).
* ``gpt2``: Conv1D weights transposed to ``(out, in)`` by the converter, transposed back.

Stacked experts (``(E, I, H)`` gate / up, ``(E, H, I)`` down, biases ``(E, I)`` / ``(E, H)``) are yielded per
expert under Hugging Face's per-expert names (``mlp.experts.E.gate_proj.weight``), which every MoE model loads;
so are older Mixtral files' per-expert tensors (``blk.N.ffn_gate.E.weight``).

Any other architecture is refused (:func:`check_architecture`), naming it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np

from attnserve.refusals import Refused
from attnserve.refusals import models as words

# GGUF tensor name (after "blk.N.") -> Hugging Face name (after "model.layers.N.")
_LLAMA_LAYER = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LLAMA_GLOBAL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_MOE_LAYER = {
    **{k: v for k, v in _LLAMA_LAYER.items() if k not in ("ffn_gate", "ffn_up", "ffn_down")},
    "ffn_gate_inp": "mlp.gate",
}
_GEMMA_LAYER = {
    **_LLAMA_LAYER,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_GPT_OSS_LAYER = {
    **_MOE_LAYER,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_gate_inp": "mlp.router",
    "attn_sinks": "self_attn.sinks",
}
del _GPT_OSS_LAYER["ffn_norm"]
# GPT-2: GGUF name after "blk.N." -> HF name after "transformer.h.N."
_GPT2_LAYER = {
    "attn_norm": "ln_1",
    "attn_qkv": "attn.c_attn",
    "attn_output": "attn.c_proj",
    "ffn_norm": "ln_2",
    "ffn_up": "mlp.c_fc",
    "ffn_down": "mlp.c_proj",
}
_GPT2_GLOBAL = {
    "token_embd.weight": "transformer.wte.weight",
    "position_embd.weight": "transformer.wpe.weight",
    "output_norm.weight": "transformer.ln_f.weight",
    "output_norm.bias": "transformer.ln_f.bias",
    "output.weight": "lm_head.weight",  # older converters wrote a copy of token_embd; the tied model skips it
}
_GPT2_CONV1D = ("attn_qkv.weight", "attn_output.weight", "ffn_up.weight", "ffn_down.weight")

_LLAMA = (_LLAMA_GLOBAL, {**_LLAMA_LAYER, "ffn_gate_inp": "mlp.gate"}, "model.layers.{}")
# general.architecture -> (global names, per-layer names, HF prefix of layer N)
GGUF_NAMES: dict[str, tuple[dict[str, str], dict[str, str], str]] = {
    "llama": _LLAMA,
    "mistral": _LLAMA,
    "qwen2": _LLAMA,
    "qwen3": _LLAMA,
    "qwen3moe": (_LLAMA_GLOBAL, _MOE_LAYER, "model.layers.{}"),
    "gemma2": (_LLAMA_GLOBAL, _GEMMA_LAYER, "model.layers.{}"),
    "gemma3": (_LLAMA_GLOBAL, _GEMMA_LAYER, "model.layers.{}"),
    "gpt-oss": (_LLAMA_GLOBAL, _GPT_OSS_LAYER, "model.layers.{}"),
    "gpt2": (_GPT2_GLOBAL, _GPT2_LAYER, "transformer.h.{}"),
}
# architectures whose Q/K rows llama.cpp permutes
_PERMUTED_QK_ARCHS = {"llama", "mistral"}
# architectures whose norms llama.cpp stores as 1 + w (Gemma's RMSNorm multiplies by 1 + w)
_NORM_PLUS_ONE_ARCHS = {"gemma2", "gemma3"}
_EXPERTS = re.compile(r"ffn_(?P<proj>gate|up|down|gate_up)_exps")

# config flag -> the layer tensors (after "blk.N.") whose biases it switches on in transformers' config classes
# that have it (LlamaConfig: both; Qwen3Config, Qwen3MoeConfig, Gemma2Config, Gemma3TextConfig: attention_bias)
BIAS_FLAGS: dict[str, tuple[str, ...]] = {
    "attention_bias": ("attn_q", "attn_k", "attn_v", "attn_output"),
    "mlp_bias": ("ffn_gate", "ffn_up", "ffn_down"),
}
# architectures whose bias tensors are optional (llama.cpp loads each if present) and said by BIAS_FLAGS; the
# biases the model has whatever its config says (Qwen2's q/k/v). gpt2 and gpt-oss: biases by design, unchecked
FLAGGED_BIAS_ARCHS: dict[str, frozenset[str]] = {
    **{arch: frozenset() for arch in ("llama", "mistral", "qwen3", "qwen3moe", "gemma2", "gemma3")},
    "qwen2": frozenset({"attn_q", "attn_k", "attn_v"}),
}


def check_architecture(arch: str, path: str) -> None:
    """Refused (``general.architecture``) for a GGUF architecture attnserve has no tensor mapping for."""
    if arch not in GGUF_NAMES:
        raise Refused(words.gguf_architecture(arch, path, list(GGUF_NAMES)))


def unpermute_qk(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's Q/K row permutation: (heads, 2, D/2, ...) -> (heads, D/2, 2, ...) reversed."""
    dim = weight.shape[0] // num_heads // 2
    w = weight.reshape(num_heads, dim, 2, *weight.shape[1:])
    return w.swapaxes(2, 1).reshape(weight.shape)


def hf_tensors(
    arch: str, name: str, data: np.ndarray, num_heads: int, num_kv_heads: int, path: str = ""
) -> Iterator[tuple[str, np.ndarray]]:
    """The Hugging Face tensors of one GGUF tensor ``name`` (``data``: float32, PyTorch's dimension order): one
    pair, one per expert for stacked experts, none for ``rope_freqs`` (recomputed from the config). Raises
    KeyError naming a tensor with no known Hugging Face name."""
    global_names, layer_names, layer_prefix = GGUF_NAMES[arch]
    if arch in _NORM_PLUS_ONE_ARCHS and name.endswith("norm.weight"):
        data = data - np.float32(1.0)
    if name in global_names:
        yield global_names[name], data
        return
    m = re.fullmatch(r"blk\.(\d+)\.ffn_(gate|up|down)\.(\d+)\.weight", name)
    if m and layer_prefix == "model.layers.{}":  # one tensor per expert (GGUFs converted before stacking, 2024)
        yield f"{layer_prefix.format(m[1])}.mlp.experts.{m[3]}.{m[2]}_proj.weight", data
        return
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias)", name)
    if m is None:
        if name == "rope_freqs.weight":
            return  # RoPE scaling factors, recomputed from the config
        raise KeyError(words.gguf_tensor_unknown(name, path, arch))
    layer, short, kind = m.groups()
    prefix = layer_prefix.format(layer)
    experts = _EXPERTS.fullmatch(short)
    if experts and layer_prefix == "model.layers.{}":
        yield from _per_expert(f"{prefix}.mlp.experts", experts["proj"], kind, data)
        return
    if short not in layer_names:
        raise KeyError(words.gguf_tensor_unknown(name, path, arch))
    hf_name = f"{prefix}.{layer_names[short]}"
    if short == "attn_sinks":  # a bare parameter in HF, no .weight (the converter adds one)
        yield hf_name, data
        return
    if arch in _PERMUTED_QK_ARCHS and short == "attn_q":
        data = unpermute_qk(data, num_heads)
    elif arch in _PERMUTED_QK_ARCHS and short == "attn_k":
        data = unpermute_qk(data, num_kv_heads)
    elif arch == "gpt2" and name.endswith(_GPT2_CONV1D):
        data = data.T  # back to Conv1D's (in, out)
    yield f"{hf_name}.{kind}", data


def _per_expert(prefix: str, proj: str, kind: str, data: np.ndarray) -> Iterator[tuple[str, np.ndarray]]:
    """Expert e's slice of a stacked tensor under ``{prefix}.{e}.{gate,up,down}_proj.{kind}``; a fused gate_up
    (E, 2I, ...) is gate rows, then up rows."""
    if proj == "gate_up":
        half = data.shape[1] // 2
        yield from _per_expert(prefix, "gate", kind, data[:, :half])
        yield from _per_expert(prefix, "up", kind, data[:, half:])
        return
    for e in range(data.shape[0]):
        yield f"{prefix}.{e}.{proj}_proj.{kind}", data[e]
