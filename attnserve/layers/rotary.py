"""Rotary position embedding (Su et al. 2021, RoFormer), NeoX style (``rotate_half``) as in HF Llama."""

from __future__ import annotations

import math

import torch
from torch import nn

from attnserve.kernels.fused_ops import RopeInputs
from attnserve.layers.norm import RMSNorm


def _inv_freq(head_size: int, base: float, rope_scaling: dict | None) -> torch.Tensor:
    inv_freq = 1.0 / (base ** (torch.arange(0, head_size, 2, dtype=torch.int64).float() / head_size))
    rope_type = (rope_scaling or {}).get("rope_type", (rope_scaling or {}).get("type", "default"))
    if rope_type in (None, "default"):
        return inv_freq
    if rope_type == "llama3":  # Llama 3.1 frequency scaling (transformers' _compute_llama3_parameters)
        factor = rope_scaling["factor"]
        low, high = rope_scaling["low_freq_factor"], rope_scaling["high_freq_factor"]
        old_len = rope_scaling["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled)
    if rope_type == "linear":
        return inv_freq / rope_scaling["factor"]
    raise ValueError(f"rope_scaling type {rope_type!r} not supported (supported: default, linear, llama3)")


class RotaryEmbedding(nn.Module):
    """Applies RoPE to query and key heads at given positions, with a precomputed cos/sin cache."""

    def __init__(self, head_size: int, max_position: int, base: float, rope_scaling: dict | None = None) -> None:
        super().__init__()
        inv_freq = _inv_freq(head_size, base, rope_scaling)
        t = torch.arange(max_position, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)  # (max_position, D/2)
        self.register_buffer("cos_cache", freqs.cos(), persistent=False)
        self.register_buffer("sin_cache", freqs.sin(), persistent=False)

    def inputs(
        self,
        positions: torch.Tensor,  # (T,) int64
        q_norm: RMSNorm | None = None,
        k_norm: RMSNorm | None = None,
    ) -> RopeInputs:
        """The tensors RoPE at ``positions`` takes (with ``q_norm``/``k_norm``, Qwen3's per-head RMSNorm
        first): what a model passes to ``Attention.forward_with_rope``."""
        return RopeInputs(positions, self.cos_cache, self.sin_cache, _norm(q_norm), _norm(k_norm))

    def forward(
        self,
        positions: torch.Tensor,  # (T,) int64
        query: torch.Tensor,  # (T, Hq, D), last dim contiguous (a view into the fused qkv output is fine)
        key: torch.Tensor,  # (T, Hkv, D)
        q_norm: RMSNorm | None = None,
        k_norm: RMSNorm | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotates ``query`` and ``key`` **in place** (one kernel on CUDA) and returns them. With
        ``q_norm``/``k_norm`` (Qwen3), each head is RMS-normalized first, in the same pass."""
        self.inputs(positions, q_norm, k_norm).apply(query, key)
        return query, key


def _norm(norm: RMSNorm | None) -> tuple[torch.Tensor, float] | None:
    return None if norm is None else (norm.weight, norm.eps)
