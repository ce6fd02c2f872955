"""Row-wise argmax, greedy sampling's last op: the Triton kernel (``triton_argmax.py``) on CUDA,
``torch.argmax`` (the definition) elsewhere and where Triton is missing. Both return each row's first
maximum (the kernel counts a NaN as +inf; see its docstring)."""

from __future__ import annotations

import functools
from types import ModuleType

import torch


@functools.cache
def _triton_argmax() -> ModuleType | None:
    """``attnserve.kernels.triton_argmax``, or None where Triton is not installed."""
    try:
        from attnserve.kernels import triton_argmax
    except ImportError:
        return None
    return triton_argmax


def argmax_rows(x: torch.Tensor) -> torch.Tensor:  # (B,) int64
    """Each row's first maximum of ``x`` (B, V): the Triton kernel on CUDA, ``torch.argmax`` elsewhere."""
    ops = _triton_argmax() if x.is_cuda else None
    return ops.argmax(x) if ops is not None else argmax_rows_torch(x)


def argmax_rows_torch(x: torch.Tensor) -> torch.Tensor:  # (B,) int64
    """The PyTorch definition of :func:`argmax_rows` (any device)."""
    return x.argmax(dim=-1)
