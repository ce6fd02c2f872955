"""Rotary position embedding (Su et al. 2021, RoFormer), NeoX style (``rotate_half``) as in HF Llama."""

from __future__ import annotations

import math

import torch
from torch import nn

from attnserve.kernels.fused_ops import RopeInputs
from attnserve.layers.norm import RMSNorm
from attnserve.refusals import models as words


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
    if rope_type == "yarn":
        return _yarn(head_size, base, rope_scaling)[0]
    raise ValueError(words.not_supported("rope_scaling type", rope_type, ["default", "linear", "llama3", "yarn"]))


def _yarn(head_size: int, base: float, rope_scaling: dict) -> tuple[torch.Tensor, float]:
    """YaRN (Peng et al. 2023) as transformers' ``_compute_yarn_parameters``: inverse frequencies blended between
    interpolated (divided by ``factor``) and extrapolated by a linear ramp over the dimensions whose rotations at
    the original context length fall between ``beta_slow`` and ``beta_fast``; and the attention factor that
    scales cos and sin (``attention_factor``, else ``0.1 ln(factor) + 1``, or the mscale ratio)."""
    factor = rope_scaling["factor"]
    original = rope_scaling["original_max_position_embeddings"]

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = rope_scaling.get("attention_factor")
    if attention_factor is None:
        m, m_all = rope_scaling.get("mscale"), rope_scaling.get("mscale_all_dim")
        attention_factor = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    beta_fast, beta_slow = rope_scaling.get("beta_fast") or 32, rope_scaling.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return head_size * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if rope_scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_size - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(head_size // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, head_size, 2).float() / head_size)
    extrapolation = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq, float(attention_factor)


def _attention_factor(rope_scaling: dict | None) -> float:
    """What cos and sin are multiplied by: YaRN's attention factor, 1 for the other RoPE types."""
    rope_type = (rope_scaling or {}).get("rope_type", (rope_scaling or {}).get("type", "default"))
    return _yarn(2, 10000.0, rope_scaling)[1] if rope_type == "yarn" else 1.0


class RotaryEmbedding(nn.Module):
    """Applies RoPE to query and key heads at given positions, with a precomputed cos/sin cache."""

    def __init__(self, head_size: int, max_position: int, base: float, rope_scaling: dict | None = None) -> None:
        super().__init__()
        inv_freq = _inv_freq(head_size, base, rope_scaling)
        t = torch.arange(max_position, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)  # (max_position, D/2)
        scale = _attention_factor(rope_scaling)
        self.register_buffer("cos_cache", freqs.cos() * scale, persistent=False)
        self.register_buffer("sin_cache", freqs.sin() * scale, persistent=False)

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
