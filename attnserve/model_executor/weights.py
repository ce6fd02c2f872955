"""Checkpoint readers: (Hugging Face name, tensor) pairs from safetensors folders and GGUF files.

GGUF tensors are dequantized with the ``gguf`` package and renamed per architecture (``general.architecture``)
to the names and layouts of the Hugging Face checkpoint (``gguf_arch.py``), so that a model's ``load_weights``
reads both alike. OPT has no llama.cpp architecture, so no GGUF mapping.
"""

from __future__ import annotations

import functools
import json
import os
import struct
from collections.abc import Iterator

import numpy as np
import torch

from attnserve.model_executor.gguf_arch import check_architecture, hf_tensors
from attnserve.refusals import models as words


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
        raise FileNotFoundError(words.no_safetensors(folder))
    for file in files:
        with safe_open(os.path.join(folder, file), framework="pt") as f:
            for name in f.keys():
                yield name, (LazySlice(f, name) if lazy else f.get_tensor(name))


@functools.cache
def _plain_array_reader():
    """gguf's ``GGUFReader`` parsing through a plain ndarray view of its memory map: the parse slices the map
    once per field part (about 250,000 times for a 49k-token vocabulary), and a ``np.memmap`` slice runs
    Python-level ``__getitem__`` and ``__array_finalize__`` each time. The same bytes, 3x faster to parse
    (2.2 -> 0.7 s for the default model on one CPU core); the view keeps the map open."""
    from gguf import GGUFReader

    class PlainArrayGGUFReader(GGUFReader):
        @property
        def data(self) -> np.ndarray:
            return self._plain_data

        @data.setter
        def data(self, value: np.ndarray) -> None:
            self._plain_data = value.view(np.ndarray) if isinstance(value, np.memmap) else value

    return PlainArrayGGUFReader


@functools.lru_cache(maxsize=1)
def _gguf_reader(path: str, mtime_ns: int):
    """One parse of a GGUF file (under a second for the default model) for the shape lookups and the weights
    of a load; ``mtime_ns`` keys a rewritten file apart. The last file's memory map stays open."""
    try:
        return _plain_array_reader()(path)
    except (struct.error, ValueError, IndexError) as e:  # an index or tensor data past the end of the file, ...
        raise ValueError(words.gguf_damaged(path, e)) from None


def gguf_reader(path: str):
    return _gguf_reader(path, os.stat(path).st_mtime_ns)


def gguf_tensor_shape(path: str, name: str) -> tuple[int, ...] | None:
    """Shape of tensor ``name`` in a GGUF file in PyTorch order (rows first), or None when absent."""
    for tensor in gguf_reader(path).tensors:
        if tensor.name == name:
            return tuple(reversed(tensor.shape.tolist()))
    return None


def gguf_architecture(path: str) -> str:
    """The file's ``general.architecture``; Refused (naming it) when attnserve has no tensor mapping for it."""
    arch = gguf_metadata(path, "general.architecture")
    check_architecture(arch, path)
    return arch


def gguf_metadata(path: str, key: str):
    """The value of metadata ``key`` (a str, number, bool, or a list of them), or None when absent."""
    field = gguf_reader(path).fields.get(key)
    if field is None:
        return None
    return field.contents()


def gguf_weights(path: str, num_heads: int, num_kv_heads: int) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of a GGUF file, dequantized to float32, under its Hugging Face name (stacked experts as
    one tensor per expert: ``gguf_arch.hf_tensors``)."""
    from gguf import dequantize

    reader = gguf_reader(path)
    arch = gguf_architecture(path)
    for tensor in reader.tensors:
        data = dequantize(tensor.data, tensor.tensor_type).reshape(tuple(reversed(tensor.shape.tolist())))
        for hf_name, part in hf_tensors(arch, tensor.name, data, num_heads, num_kv_heads, path):
            yield hf_name, torch.from_numpy(np.array(part, dtype=np.float32))  # a copy: GGUF data is a read-only memmap
