"""The SwiGLU MLP (Shazeer 2020): ``down(silu(gate) * up)`` with gate and up in one column-parallel matmul.

The MLP computes through one method object, ``mlp_method`` (as linear layers do through ``quant_method``): by
default :class:`SwiGLUMethod` (gate/up, the SwiGLU kernel, down); the GEMV plan (``attnserve/gemv``) installs
one that fuses the SwiGLU into a GEMV for the decode row counts where it measured that faster.
"""

from __future__ import annotations

import torch
from torch import nn

from attnserve.distributed.group import SINGLE, TPGroup
from attnserve.layers.activation import SiluAndMul
from attnserve.layers.linear import MergedColumnParallelLinear, RowParallelLinear


class SwiGLUMethod:
    """How a :class:`SwiGLUMLP` computes its output: ``down_proj(act(gate_up_proj(x)))``."""

    def apply(self, mlp: SwiGLUMLP, x: torch.Tensor) -> torch.Tensor:  # (T, hidden) -> (T, hidden)
        return mlp.down_proj(mlp.act(mlp.gate_up_proj(x)))


class SwiGLUMLP(nn.Module):
    """(T, hidden) -> (T, hidden). Parameters ``gate_up_proj`` ((2 I_local, hidden): this rank's gate rows, then
    its up rows) and ``down_proj`` ((hidden, I_local), one all-reduce under tensor parallelism)."""

    mlp_method: SwiGLUMethod = SwiGLUMethod()  # the GEMV plan may set another (attnserve/gemv)

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False, tp: TPGroup = SINGLE) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden_size, [intermediate_size, intermediate_size], bias, tp)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias, tp)
        self.act = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (T, hidden) -> (T, hidden)
        return self.mlp_method.apply(self, x)
