"""Linear layers split Megatron-style over tensor-parallel ranks (Shoeybi et al. 2019; vLLM ``linear.py``).

* Column-parallel (QKV, gate/up): each rank holds some output rows; its output stays sharded.
* Row-parallel (attention output, down): each rank holds the input columns matching the column-parallel
  layer before it; partial products are summed with one all-reduce, then the bias is added once.

With ``tp.size == 1`` every layer is exactly ``F.linear(x, weight, bias)``: today's ``nn.Linear`` math and
no collective. With ``use_skinny_gemm``, a step of up to 64 rows may instead run the Triton GEMV that
``gemv_plan.GemvPlan`` measured faster than cuBLAS for the layer's shape (the layer's ``gemv`` table); a
row-parallel layer whose input is SwiGLU (``silu_mul_input``: an MLP's down projection) may instead take the
gate/up output and run a GEMV that computes the SwiGLU itself (``forward_silu_mul``, the ``gemv_silu_mul``
table), or the gate/up layer itself (``swiglu_output``) may run a GEMV whose epilogue computes the SwiGLU
(``forward_swiglu``, the ``gemv_swiglu`` table).
Parameters keep ``nn.Linear``'s names (``weight``, ``bias``) so checkpoints map unchanged.

Loading: each parameter carries ``weight_loader(param, loaded, shard_id=None)``, which narrows the *full*
checkpoint tensor to this rank's slice and copies it. ``loaded`` is a tensor or a lazy checkpoint slice
(anything with ``shape``, ``narrow`` and ``[...]``), so a rank reads only its rows from a safetensors file.
Raises ValueError on a checkpoint shape that does not match the full (unsplit) layer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from attnserve.distributed.group import SINGLE, TPGroup
from attnserve.distributed.sharding import shard_heads, shard_range


class CheckpointShapeError(ValueError):
    """A checkpoint tensor whose shape differs from the layer's (the engine reads the type: a GGUF's cached config
    that no longer fits its weights is converted again)."""


def gemv_or_linear(gemv: tuple, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear``, or the Triton GEMV that a ``GemvPlan`` chose for x's row count (``gemv_plan.py``).

    ``gemv``: a layer's table, row count -> ``f(x, weight, bias)`` or None (cuBLAS)."""
    f = table_entry(gemv, x.shape[0])
    return F.linear(x, weight, bias) if f is None else f(x, weight, bias)


def table_entry(table: tuple | None, rows: int) -> Callable | None:
    """A GemvPlan table's GEMV for ``rows`` rows, or None (no table, past its row counts, or not chosen)."""
    return table[rows] if table is not None and rows < len(table) else None


def check_shape(loaded, expected: tuple[int, ...]) -> None:
    if tuple(loaded.shape) != tuple(expected):
        raise CheckpointShapeError(f"checkpoint shape {tuple(loaded.shape)} != expected {tuple(expected)}")


def _param(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape), requires_grad=False)


@dataclass(frozen=True)
class OutputShard:
    """One logical part of a column-parallel output (q, k, v; gate, up): ``size`` of its ``full`` checkpoint
    rows starting at ``start`` live on this rank."""

    full: int
    start: int
    size: int


class ColumnParallelLinear(nn.Module):
    """``y_local = x W_local^T + b_local``: (T, in) -> (T, sum of this rank's shard sizes)."""

    gemv: tuple | None = None  # set once by GemvPlan.apply: small row counts -> a Triton GEMV (None: cuBLAS)

    def __init__(self, in_features: int, out_features: int, bias: bool = True, tp: TPGroup = SINGLE,
                 shards: list[OutputShard] | None = None) -> None:
        super().__init__()
        self.tp = tp
        self.in_features = in_features
        if shards is None:
            start, size = shard_range(out_features, tp.size, tp.rank)
            shards = [OutputShard(out_features, start, size)]
        self.shards = shards
        self.offsets = [sum(s.size for s in shards[:i]) for i in range(len(shards))]  # local row of each part
        local = sum(s.size for s in shards)
        self.weight = _param(local, in_features)
        self.weight.weight_loader = self.weight_loader
        self.bias = _param(local) if bias else None
        if self.bias is not None:
            self.bias.weight_loader = self.weight_loader

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (T, in) -> (T, local out)
        if self.gemv is None:
            return F.linear(x, self.weight, self.bias)
        return gemv_or_linear(self.gemv, x, self.weight, self.bias)

    def weight_loader(self, param: nn.Parameter, loaded, shard_id: int | None = None) -> None:
        """Copy this rank's rows of checkpoint part ``shard_id`` (None: the one part, or all parts fused)."""
        if shard_id is None and len(self.shards) > 1:
            check_shape(loaded, (sum(s.full for s in self.shards), *param.shape[1:]))
            row = 0
            for i, s in enumerate(self.shards):
                self.weight_loader(param, loaded.narrow(0, row, s.full), i)
                row += s.full
            return
        i = shard_id or 0
        s = self.shards[i]
        check_shape(loaded, (s.full, *param.shape[1:]))
        param.data.narrow(0, self.offsets[i], s.size).copy_(loaded.narrow(0, s.start, s.size)[...])


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs in one matmul (gate and up): each part split evenly over ranks.

    ``swiglu_output``: the two parts are an MLP's gate and up, and what follows is their SwiGLU
    (``silu_and_mul``), so ``GemvPlan`` may give the layer a GEMV that applies the SwiGLU in its epilogue
    (:meth:`forward_swiglu`)."""

    # set once by GemvPlan.apply on a swiglu_output layer: small row counts -> a GEMV f(x, weight, bias) whose
    # output is SwiGLU of this layer's (None: this layer, then the SwiGLU kernel)
    gemv_swiglu: tuple | None = None

    def __init__(self, in_features: int, out_sizes: list[int], bias: bool = True, tp: TPGroup = SINGLE,
                 swiglu_output: bool = False) -> None:
        shards = [OutputShard(n, *shard_range(n, tp.size, tp.rank)) for n in out_sizes]
        super().__init__(in_features, sum(out_sizes), bias, tp, shards)
        if swiglu_output and (len(out_sizes) != 2 or out_sizes[0] != out_sizes[1]):
            raise ValueError(f"swiglu_output needs two equal parts (gate, up), got {out_sizes}")
        self.swiglu_output = swiglu_output

    def forward_swiglu(self, x: torch.Tensor) -> torch.Tensor | None:  # (T, in) -> (T, local I) or None
        """``silu_and_mul(self(x))`` in one launch where the plan chose the fused GEMV for T rows (this rank's
        weight is ``[gate; up]`` of its columns, so the same holds under tensor parallelism); None otherwise,
        for the caller to run the layer and the SwiGLU. A tuple lookup: no host sync, CUDA-graph capturable."""
        f = table_entry(self.gemv_swiglu, x.shape[0])
        return None if f is None else f(x, self.weight, self.bias)


class QKVParallelLinear(ColumnParallelLinear):
    """Q, K and V in one matmul, split by attention head (KV heads replicated when fewer than ranks).

    ``num_heads`` / ``num_kv_heads`` / ``q_size`` / ``kv_size`` are this rank's; ``head_shard`` says which.
    """

    def __init__(self, hidden_size: int, head_size: int, num_heads: int, num_kv_heads: int, bias: bool = False,
                 tp: TPGroup = SINGLE) -> None:
        h = shard_heads(num_heads, num_kv_heads, tp.size, tp.rank)
        self.head_shard = h
        D = head_size
        shards = [OutputShard(num_heads * D, h.q_start * D, h.num_heads * D),
                  OutputShard(num_kv_heads * D, h.kv_start * D, h.num_kv_heads * D),
                  OutputShard(num_kv_heads * D, h.kv_start * D, h.num_kv_heads * D)]
        super().__init__(hidden_size, (num_heads + 2 * num_kv_heads) * D, bias, tp, shards)
        self.num_heads, self.num_kv_heads = h.num_heads, h.num_kv_heads
        self.q_size, self.kv_size = h.num_heads * D, h.num_kv_heads * D


class RowParallelLinear(nn.Module):
    """``y = all_reduce(x_local W_local^T) + b``: (T, local in) -> (T, out), the same on every rank.

    ``in_shard`` = ``(start, size)`` of the input columns this rank holds (default: an even split); it must
    match the column-parallel layer that produced ``x_local``. ``silu_mul_input``: the input is SwiGLU of a
    ``[gate, up]`` column-parallel output (call :meth:`forward_silu_mul` with that output), so GemvPlan
    also measures the GEMV with the SwiGLU fused in.
    """

    gemv: tuple | None = None  # as ColumnParallelLinear.gemv
    # set once by GemvPlan.apply on a silu_mul_input layer: small row counts -> a GEMV f(gate_up, weight, bias)
    # that applies the SwiGLU itself (None: the SwiGLU kernel, then this layer)
    gemv_silu_mul: tuple | None = None

    def __init__(self, in_features: int, out_features: int, bias: bool = True, tp: TPGroup = SINGLE,
                 in_shard: tuple[int, int] | None = None, silu_mul_input: bool = False) -> None:
        super().__init__()
        self.tp = tp
        self.silu_mul_input = silu_mul_input
        self.in_features = in_features
        self.in_start, in_size = in_shard if in_shard is not None else shard_range(in_features, tp.size, tp.rank)
        self.weight = _param(out_features, in_size)
        self.weight.weight_loader = self.weight_loader
        self.bias = _param(out_features) if bias else None
        if self.bias is not None:
            self.bias.weight_loader = self.weight_loader

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (T, local in) -> (T, out)
        if self.tp.size == 1:
            if self.gemv is None:
                return F.linear(x, self.weight, self.bias)
            return gemv_or_linear(self.gemv, x, self.weight, self.bias)
        y = self.tp.all_reduce(F.linear(x, self.weight) if self.gemv is None else
                               gemv_or_linear(self.gemv, x, self.weight, None))
        return y if self.bias is None else y + self.bias  # the bias once, not once per rank

    def forward_silu_mul(self, gate_up: torch.Tensor,  # (T, 2 * local in): [gate | up] of this rank's columns
                         act: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:  # (T, out)
        """``self(act(gate_up))`` with ``act`` the SwiGLU (``SiluAndMul``); where the plan chose the fused
        GEMV for T rows, that one launch instead (the same bits: ``triton_gemv``). The choice is a tuple
        lookup: no host sync, CUDA-graph capturable."""
        f = table_entry(self.gemv_silu_mul, gate_up.shape[0])
        if f is None:
            return self(act(gate_up))
        if self.tp.size == 1:
            return f(gate_up, self.weight, self.bias)
        y = self.tp.all_reduce(f(gate_up, self.weight, None))
        return y if self.bias is None else y + self.bias

    def weight_loader(self, param: nn.Parameter, loaded, shard_id: int | None = None) -> None:
        if param.dim() == 1:  # bias: replicated
            check_shape(loaded, param.shape)
            param.data.copy_(loaded[...])
            return
        check_shape(loaded, (param.shape[0], self.in_features))
        param.data.copy_(loaded.narrow(1, self.in_start, param.shape[1])[...])
