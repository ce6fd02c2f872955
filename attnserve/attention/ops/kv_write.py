"""Writing a step's new keys and values into the paged KV cache (vLLM's ``reshape_and_cache``)."""

from __future__ import annotations

import torch


def write_kv_cache(
    key: torch.Tensor,  # (T, Hkv, D)
    value: torch.Tensor,  # (T, Hkv, D)
    kv_cache: torch.Tensor,  # (2, num_blocks, block_size, Hkv, D), any stride order (NHD or HND)
    slot_mapping: torch.Tensor,  # (T,) int64, flat slot = block_id * block_size + offset; -1 = skip
) -> None:
    """Store ``key``/``value`` of each token at its slot. Plain PyTorch: works on any device and layout.

    Tokens with slot -1 (padding) are skipped. The cache is indexed through its logical NHD shape, so a
    physically HND cache (a permuted view) is written correctly too.
    """
    block_size = kv_cache.shape[2]
    valid = slot_mapping >= 0
    if not bool(valid.all()):
        key, value, slot_mapping = key[valid], value[valid], slot_mapping[valid]
    block_idx = slot_mapping // block_size
    offset = slot_mapping % block_size
    kv_cache[0, block_idx, offset] = key.to(kv_cache.dtype)
    kv_cache[1, block_idx, offset] = value.to(kv_cache.dtype)
