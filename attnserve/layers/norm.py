"""RMSNorm and LayerNorm as Hugging Face computes them (float32 statistics)."""

from __future__ import annotations

import torch
from torch import nn

from attnserve.kernels.fused_ops import rms_norm


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x^2) + eps) * weight`` (Zhang & Sennrich 2019), statistics in float32 like HF Llama."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(
        self,
        x: torch.Tensor,  # (..., hidden)
        residual: torch.Tensor | None = None,  # (..., hidden): normalize x + residual instead
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``norm(x)``; with ``residual``, ``(norm(x + residual), x + residual)`` in one kernel on CUDA
        (vLLM's fused_add_rms_norm): a pre-norm block passes its residual stream through here."""
        return rms_norm(x, self.weight, self.eps, residual)
