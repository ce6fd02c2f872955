"""Checkpoint readers: (Hugging Face name, tensor) pairs from safetensors folders and GGUF files.

GGUF tensors are dequantized with the ``gguf`` package. llama.cpp's converter permutes the rows of Q and K
of llama-architecture models (``convert_hf_to_gguf.py: LlamaModel.permute``) to its interleaved RoPE;
:func:`unpermute_qk` undoes it so the weights match Hugging Face's NeoX-style rotary layout.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator

import numpy as np
import torch

# GGUF tensor name (after "blk.N.") -> Hugging Face name (after "model.layers.N.")
_GGUF_LAYER_NAMES = {
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
_GGUF_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# architectures whose Q/K rows llama.cpp permutes
_PERMUTED_QK_ARCHS = {"llama", "mistral"}


def safetensors_weights(folder: str) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of the folder's ``*.safetensors`` files (sharded checkpoints via their index)."""
    from safetensors import safe_open

    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors files in {folder}")
    for file in files:
        with safe_open(os.path.join(folder, file), framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def unpermute_qk(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's Q/K row permutation: (heads, 2, D/2, ...) -> (heads, D/2, 2, ...) reversed."""
    dim = weight.shape[0] // num_heads // 2
    w = weight.reshape(num_heads, dim, 2, *weight.shape[1:])
    return w.swapaxes(2, 1).reshape(weight.shape)


def gguf_weights(path: str, num_heads: int, num_kv_heads: int) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of a GGUF file, dequantized to float32, under its Hugging Face name."""
    from gguf import GGUFReader, dequantize

    reader = GGUFReader(path)
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    for tensor in reader.tensors:
        name = tensor.name
        if name in _GGUF_GLOBAL_NAMES:
            hf_name = _GGUF_GLOBAL_NAMES[name]
        else:
            m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias)", name)
            if m is None or m.group(2) not in _GGUF_LAYER_NAMES:
                if name == "rope_freqs.weight":
                    continue  # RoPE scaling factors, recomputed from the config
                raise KeyError(f"GGUF tensor {name!r} in {path} has no known Hugging Face name")
            hf_name = f"model.layers.{m.group(1)}.{_GGUF_LAYER_NAMES[m.group(2)]}.{m.group(3)}"
        data = dequantize(tensor.data, tensor.tensor_type).reshape(tuple(reversed(tensor.shape.tolist())))
        if arch in _PERMUTED_QK_ARCHS and name.endswith(("attn_q.weight", "attn_q.bias")):
            data = unpermute_qk(data, num_heads)
        elif arch in _PERMUTED_QK_ARCHS and name.endswith(("attn_k.weight", "attn_k.bias")):
            data = unpermute_qk(data, num_kv_heads)
        yield hf_name, torch.from_numpy(np.array(data, dtype=np.float32))  # a copy: GGUF data is a read-only memmap
