"""``F.linear`` through cuBLASLt instead of cuBLAS, for the decode shapes where ``GemvPlan`` measured it faster.

torch picks its BLAS library per call from one process-wide preference
(``torch.backends.cuda.preferred_blas_library``, default cuBLAS); :func:`cublaslt_linear` switches it to
cuBLASLt for one call and back, so nothing else in the process is affected. Inside a CUDA graph the kernel
chosen at capture is what every replay runs. cuBLASLt wins on large shapes at 64 rows
(``benchmarks/gpu/bench_blas.py``; figures in docs/benchmarks.md).
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager

import torch
import torch.nn.functional as F

_state = {"switched": False}


@contextmanager
def _stderr_silenced():
    """File descriptor 2 pointed at /dev/null for the block (C++ writes there directly, past ``sys.stderr``)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _set(library) -> None:
    if _state["switched"]:
        torch.backends.cuda.preferred_blas_library(library)
        return
    # the first switch makes torch print, once, from C++ (so no ``warnings`` filter reaches it), that the
    # preference is experimental and to report errors; the switch here is scoped to one call and measured
    with _stderr_silenced():
        torch.backends.cuda.preferred_blas_library(library)
    _state["switched"] = True


@contextmanager
def _prefer(library: str):
    previous = torch.backends.cuda.preferred_blas_library()
    _set(library)
    try:
        yield
    finally:
        _set(previous)


def cublaslt_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` (x (M, K), weight (N, K) -> (M, N), x's dtype) computed by cuBLASLt."""
    with _prefer("cublaslt"):
        return F.linear(x, weight, bias)
