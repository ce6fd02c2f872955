"""Checkpoint readers: (Hugging Face name, tensor) pairs from safetensors folders and GGUF files.

GGUF tensors are dequantized with the ``gguf`` package and renamed per architecture (``general.architecture``)
to the names and layouts of the Hugging Face checkpoint, so that a model's ``load_weights`` reads both alike:

* llama / mistral / qwen2 / qwen3: llama.cpp's converter permutes the rows of Q and K of llama-architecture
  models (``convert_hf_to_gguf.py: LlamaModel.permute``) to its interleaved RoPE; :func:`unpermute_qk` undoes
  it so the weights match Hugging Face's NeoX-style rotary layout.
* gpt2: the converter (``GPT2Model.modify_tensors``) transposes the Conv1D weights ``c_attn``, ``c_proj``,
  ``c_fc`` to ``(out, in)`` and drops the causal-mask buffers; they are transposed back to Conv1D's ``(in, out)``.

OPT has no llama.cpp architecture, so no GGUF mapping.
"""

from __future__ import annotations

import functools
import json
import os
import re
import struct
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
# GPT-2 (llama.cpp arch "gpt2"): GGUF name after "blk.N." -> HF name after "transformer.h.N."
_GGUF_GPT2_LAYER_NAMES = {
    "attn_norm": "ln_1",
    "attn_qkv": "attn.c_attn",
    "attn_output": "attn.c_proj",
    "ffn_norm": "ln_2",
    "ffn_up": "mlp.c_fc",
    "ffn_down": "mlp.c_proj",
}
_GGUF_GPT2_GLOBAL_NAMES = {
    "token_embd.weight": "transformer.wte.weight",
    "position_embd.weight": "transformer.wpe.weight",
    "output_norm.weight": "transformer.ln_f.weight",
    "output_norm.bias": "transformer.ln_f.bias",
    "output.weight": "lm_head.weight",  # older converters wrote a copy of token_embd; the tied model skips it
}
_GPT2_CONV1D = ("attn_qkv.weight", "attn_output.weight", "ffn_up.weight", "ffn_down.weight")

# general.architecture -> (global names, per-layer names, HF prefix of layer N)
_GGUF_NAMES = {
    "gpt2": (_GGUF_GPT2_GLOBAL_NAMES, _GGUF_GPT2_LAYER_NAMES, "transformer.h.{}"),
}
_LLAMA_NAMES = (_GGUF_GLOBAL_NAMES, _GGUF_LAYER_NAMES, "model.layers.{}")
# architectures whose Q/K rows llama.cpp permutes
_PERMUTED_QK_ARCHS = {"llama", "mistral"}


class LazySlice:
    """A checkpoint tensor not yet read: ``narrow`` reads only the asked rows/columns from the file,
    ``[...]`` reads it whole. Tensor-parallel ranks load through it, so each reads only its shard."""

    def __init__(self, handle, name: str) -> None:
        self._slice = handle.get_slice(name)
        self.shape = tuple(self._slice.get_shape())

    def narrow(self, dim: int, start: int, length: int) -> torch.Tensor:
        index = (slice(None),) * dim + (slice(start, start + length),)
        return self._slice[index]

    def __getitem__(self, index) -> torch.Tensor:
        if index is Ellipsis:  # a 0-d tensor (an fp8 k_scale) takes no slice(): [...] reads any tensor whole
            return self._slice[...] if not self.shape else self._slice[:]
        return self._slice[index]


def safetensors_files(folder: str) -> list[str]:
    """The folder's checkpoint files (names): those its ``model.safetensors.index.json`` maps tensors to, else
    every ``*.safetensors``; empty when there are none."""
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            return sorted(set(json.load(f)["weight_map"].values()))
    return sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))


def safetensors_weights(folder: str, lazy: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of the folder's ``*.safetensors`` files (sharded checkpoints via their index).

    ``lazy``: yield a :class:`LazySlice` per tensor instead (valid until the next item is taken).
    """
    from safetensors import safe_open

    files = safetensors_files(folder)
    if not files:
        raise FileNotFoundError(f"no .safetensors files in {folder}")
    for file in files:
        with safe_open(os.path.join(folder, file), framework="pt") as f:
            for name in f.keys():
                yield name, (LazySlice(f, name) if lazy else f.get_tensor(name))


def unpermute_qk(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's Q/K row permutation: (heads, 2, D/2, ...) -> (heads, D/2, 2, ...) reversed."""
    dim = weight.shape[0] // num_heads // 2
    w = weight.reshape(num_heads, dim, 2, *weight.shape[1:])
    return w.swapaxes(2, 1).reshape(weight.shape)


@functools.lru_cache(maxsize=1)
def _gguf_reader(path: str, mtime_ns: int):
    """One parse of a GGUF file (~2.4 s for the default model) for the shape lookups and the weights of
    a load; ``mtime_ns`` keys a rewritten file apart. The last file's memory map stays open."""
    from gguf import GGUFReader

    try:
        return GGUFReader(path)
    except (struct.error, ValueError, IndexError) as e:  # an index or tensor data past the end of the file, ...
        raise ValueError(f"GGUF file {path} is truncated or damaged: {e}") from None


def gguf_reader(path: str):
    return _gguf_reader(path, os.stat(path).st_mtime_ns)


def gguf_tensor_shape(path: str, name: str) -> tuple[int, ...] | None:
    """Shape of tensor ``name`` in a GGUF file in PyTorch order (rows first), or None when absent."""
    for tensor in gguf_reader(path).tensors:
        if tensor.name == name:
            return tuple(reversed(tensor.shape.tolist()))
    return None


def gguf_weights(path: str, num_heads: int, num_kv_heads: int) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of a GGUF file, dequantized to float32, under its Hugging Face name."""
    from gguf import dequantize

    reader = gguf_reader(path)
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    global_names, layer_names, layer_prefix = _GGUF_NAMES.get(arch, _LLAMA_NAMES)
    for tensor in reader.tensors:
        name = tensor.name
        if name in global_names:
            hf_name = global_names[name]
        else:
            m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias)", name)
            if m is None or m.group(2) not in layer_names:
                if name == "rope_freqs.weight":
                    continue  # RoPE scaling factors, recomputed from the config
                raise KeyError(f"GGUF tensor {name!r} in {path} (architecture {arch}) has no known Hugging Face name")
            hf_name = f"{layer_prefix.format(m.group(1))}.{layer_names[m.group(2)]}.{m.group(3)}"
        data = dequantize(tensor.data, tensor.tensor_type).reshape(tuple(reversed(tensor.shape.tolist())))
        if arch in _PERMUTED_QK_ARCHS and name.endswith(("attn_q.weight", "attn_q.bias")):
            data = unpermute_qk(data, num_heads)
        elif arch in _PERMUTED_QK_ARCHS and name.endswith(("attn_k.weight", "attn_k.bias")):
            data = unpermute_qk(data, num_kv_heads)
        elif arch == "gpt2" and name.endswith(_GPT2_CONV1D):
            data = data.T  # back to Conv1D's (in, out)
        yield hf_name, torch.from_numpy(np.array(data, dtype=np.float32))  # a copy: GGUF data is a read-only memmap
