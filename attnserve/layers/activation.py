"""Gated activations."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attnserve.kernels.fused_ops import silu_and_mul
from attnserve.refusals import models as words


class SiluAndMul(nn.Module):
    """SwiGLU (Shazeer 2020): input ``[gate, up]`` concatenated on the last dim -> ``silu(gate) * up``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (T, 2I) -> (T, I)
        return silu_and_mul(x)  # one kernel on CUDA


# Hugging Face ``activation_function`` / ``hidden_act`` name -> elementwise activation (transformers' ACT2FN)
_ACTIVATIONS = {
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),  # GPT-2's tanh approximation (Hendrycks & Gimpel 2016)
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
    "relu": F.relu,
    "silu": F.silu,
}


def get_act_fn(name: str):
    """The activation named ``name`` in a Hugging Face config; ValueError naming the supported ones."""
    if name not in _ACTIVATIONS:
        raise ValueError(words.not_supported("activation", name, sorted(_ACTIVATIONS)))
    return _ACTIVATIONS[name]
