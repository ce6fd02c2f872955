"""Gated activations."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SiluAndMul(nn.Module):
    """SwiGLU (Shazeer 2020): input ``[gate, up]`` concatenated on the last dim -> ``silu(gate) * up``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (T, 2I) -> (T, I)
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up
