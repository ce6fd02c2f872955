"""Writing a step's new keys and values into the paged KV cache (vLLM's ``reshape_and_cache``).

Two implementations of one operation: a Triton kernel (one program per token, both K and V, fp8
quantization with a per-tensor scale fused in) and a plain-PyTorch fallback that runs on any device.
Both take the cache as two views ``(num_blocks, block_size, Hkv, D)`` of any strides (:func:`kv_views`),
so every backend's cache shape and both memory orders (NHD, HND) are written correctly.

A backend that lets the layer's RoPE kernel write K/V for it (one launch instead of two) says where they go
with a :class:`KVWriteTarget` (``AttentionImpl.kv_write_target``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def kv_views(kv_cache: torch.Tensor, kv_dim: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Key and value views ``(num_blocks, block_size, Hkv, D)`` of a layer's cache whose K/V index is
    dimension ``kv_dim``: 0 for ``(2, N, B, H, D)``, 1 for ``(N, 2, B, H, D)``."""
    return kv_cache.select(kv_dim, 0), kv_cache.select(kv_dim, 1)


@dataclass(frozen=True)
class KVWriteTarget:
    """Where one layer's new keys and values go in one step: the arguments of :func:`write_kv` but K/V."""

    key_cache: torch.Tensor  # (num_blocks, block_size, Hkv, D), any strides, last dim contiguous
    value_cache: torch.Tensor  # (num_blocks, block_size, Hkv, D), same
    slot_mapping: torch.Tensor  # (T,) int64: flat slot = block_id * block_size + offset; -1 = skip the token
    k_scale: float = 1.0  # fp8 cache: stored key = key / k_scale, saturated
    v_scale: float = 1.0

    def write(self, key: torch.Tensor, value: torch.Tensor) -> None:  # (T, Hkv, D) each
        """:func:`write_kv` of ``key``/``value`` here."""
        write_kv(key, value, self.key_cache, self.value_cache, self.slot_mapping, self.k_scale, self.v_scale)


def write_kv_cache(
    key: torch.Tensor,  # (T, Hkv, D)
    value: torch.Tensor,  # (T, Hkv, D)
    kv_cache: torch.Tensor,  # (2, num_blocks, block_size, Hkv, D), any stride order (NHD or HND)
    slot_mapping: torch.Tensor,  # (T,) int64, flat slot = block_id * block_size + offset; -1 = skip
) -> None:
    """Store ``key``/``value`` of each token at its slot in a ``(2, N, B, H, D)`` cache (plain PyTorch)."""
    key_cache, value_cache = kv_views(kv_cache, 0)
    write_kv_torch(key, value, key_cache, value_cache, slot_mapping)


def write_kv_torch(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """PyTorch fallback: any device, any strides. Tokens with slot -1 (padding) are skipped; an fp8 cache
    stores ``key / k_scale`` (and ``value / v_scale``)."""
    block_size = key_cache.shape[1]
    valid = slot_mapping >= 0
    if not bool(valid.all()):
        key, value, slot_mapping = key[valid], value[valid], slot_mapping[valid]
    block_idx = slot_mapping // block_size
    offset = slot_mapping % block_size
    if key_cache.dtype in FP8_DTYPES:
        key, value = _quantize(key, k_scale, key_cache.dtype), _quantize(value, v_scale, value_cache.dtype)
    key_cache[block_idx, offset] = key.to(key_cache.dtype)
    value_cache[block_idx, offset] = value.to(value_cache.dtype)


def _quantize(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    fmax = torch.finfo(dtype).max
    return (x.float() / scale).clamp(-fmax, fmax).to(dtype)


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """The Triton kernel on CUDA, the PyTorch fallback elsewhere (or when Triton is missing)."""
    if key.is_cuda:
        try:
            from attnserve.kernels.triton_kv_write import reshape_and_cache
        except ImportError:
            pass
        else:
            reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale)
            return
    write_kv_torch(key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale)
