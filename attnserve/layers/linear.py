"""Linear layers split Megatron-style over tensor-parallel ranks (Shoeybi et al. 2019; vLLM ``linear.py``).

* Column-parallel (QKV, gate/up): each rank holds some output rows; its output stays sharded.
* Row-parallel (attention output, down): each rank holds the input columns matching the column-parallel
  layer before it; partial products are summed with one all-reduce, then the bias is added once.

With ``tp.size == 1`` every layer is exactly ``F.linear(x, weight, bias)``: today's ``nn.Linear`` math and
no collective. Each layer computes its local product through one method object, ``quant_method`` (vLLM's
``LinearBase.quant_method``): by default :class:`UnquantizedLinearMethod` (``F.linear``); the GEMV plan
(``attnserve/gemv``) installs another on the layers where it measured a faster kernel for decode row counts.
Parameters keep ``nn.Linear``'s names (``weight``, ``bias``) so checkpoints map unchanged.

Loading: each parameter carries ``weight_loader(param, loaded, shard_id=None)``, which narrows the *full*
checkpoint tensor to this rank's slice and copies it. ``loaded`` is a tensor or a lazy checkpoint slice
(anything with ``shape``, ``narrow`` and ``[...]``), so a rank reads only its rows from a safetensors file.
Raises ValueError on a checkpoint shape that does not match the full (unsplit) layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from attnserve.distributed.group import SINGLE, TPGroup
from attnserve.distributed.sharding import shard_heads, shard_range
from attnserve.refusals import models as words


class CheckpointShapeError(ValueError):
    """A checkpoint tensor whose shape differs from the layer's (the engine reads the type: a GGUF's cached config
    that no longer fits its weights is converted again); ``tensor``: the checkpoint tensor's name, when known."""

    def __init__(self, shape: tuple, expected: tuple, tensor: str | None = None) -> None:
        super().__init__(shape, expected, tensor)  # args rebuild it when unpickled (a worker's, a Ray actor's)
        self.shape, self.expected, self.tensor = tuple(shape), tuple(expected), tensor

    def __str__(self) -> str:
        return words.checkpoint_shape(self.shape, self.expected, self.tensor)

    def of(self, tensor: str) -> CheckpointShapeError:
        """This mismatch placed at checkpoint tensor ``tensor``."""
        return CheckpointShapeError(self.shape, self.expected, tensor)


class UnquantizedLinearMethod:
    """How a linear layer computes ``x W^T + b`` from its parameters (vLLM's ``LinearMethodBase`` /
    ``UnquantizedLinearMethod``): ``F.linear(x, layer.weight, bias)``. Subclasses (``attnserve/gemv``) run
    another kernel for some row counts."""

    def apply(
        self,
        layer: nn.Module,
        x: torch.Tensor,  # (T, in)
        bias: torch.Tensor | None,
    ) -> torch.Tensor:  # (T, out) in x's dtype
        return F.linear(x, layer.weight, bias)


UNQUANTIZED = UnquantizedLinearMethod()


def check_shape(loaded, expected: tuple[int, ...]) -> None:
    if tuple(loaded.shape) != tuple(expected):
        raise CheckpointShapeError(tuple(loaded.shape), tuple(expected))


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

    quant_method: UnquantizedLinearMethod = UNQUANTIZED  # the GEMV plan may set another (attnserve/gemv)

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        tp: TPGroup = SINGLE,
        shards: list[OutputShard] | None = None,
    ) -> None:
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
        return self.quant_method.apply(self, x, self.bias)

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
    """Several column-parallel outputs in one matmul (gate and up): each part split evenly over ranks."""

    def __init__(self, in_features: int, out_sizes: list[int], bias: bool = True, tp: TPGroup = SINGLE) -> None:
        shards = [OutputShard(n, *shard_range(n, tp.size, tp.rank)) for n in out_sizes]
        super().__init__(in_features, sum(out_sizes), bias, tp, shards)


class QKVParallelLinear(ColumnParallelLinear):
    """Q, K and V in one matmul, split by attention head (KV heads replicated when fewer than ranks).

    ``num_heads`` / ``num_kv_heads`` / ``q_size`` / ``kv_size`` are this rank's; ``head_shard`` says which.
    """

    def __init__(
        self,
        hidden_size: int,
        head_size: int,
        num_heads: int,
        num_kv_heads: int,
        bias: bool = False,
        tp: TPGroup = SINGLE,
    ) -> None:
        h = shard_heads(num_heads, num_kv_heads, tp.size, tp.rank)
        self.head_shard = h
        D = head_size
        shards = [
            OutputShard(num_heads * D, h.q_start * D, h.num_heads * D),
            OutputShard(num_kv_heads * D, h.kv_start * D, h.num_kv_heads * D),
            OutputShard(num_kv_heads * D, h.kv_start * D, h.num_kv_heads * D),
        ]
        super().__init__(hidden_size, (num_heads + 2 * num_kv_heads) * D, bias, tp, shards)
        self.num_heads, self.num_kv_heads = h.num_heads, h.num_kv_heads
        self.q_size, self.kv_size = h.num_heads * D, h.num_kv_heads * D


class RowParallelLinear(nn.Module):
    """``y = all_reduce(x_local W_local^T) + b``: (T, local in) -> (T, out), the same on every rank.

    ``in_shard`` = ``(start, size)`` of the input columns this rank holds (default: an even split); it must
    match the column-parallel layer that produced ``x_local``.
    """

    quant_method: UnquantizedLinearMethod = UNQUANTIZED  # the GEMV plan may set another (attnserve/gemv)

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        tp: TPGroup = SINGLE,
        in_shard: tuple[int, int] | None = None,
    ) -> None:
        super().__init__()
        self.tp = tp
        self.in_features = in_features
        self.in_start, in_size = in_shard if in_shard is not None else shard_range(in_features, tp.size, tp.rank)
        self.weight = _param(out_features, in_size)
        self.weight.weight_loader = self.weight_loader
        self.bias = _param(out_features) if bias else None
        if self.bias is not None:
            self.bias.weight_loader = self.weight_loader

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (T, local in) -> (T, out)
        return self.apply_method(self.quant_method, x)

    def apply_method(self, method: UnquantizedLinearMethod, x: torch.Tensor) -> torch.Tensor:  # (T, out)
        """``method.apply`` on this rank's weight columns; under tensor parallelism the ranks' partial products
        all-reduced, then the bias added once (not once per rank). ``x``: what ``method`` takes (this rank's
        input columns; a fused method may take another input, e.g. the ``[gate | up]`` its GEMV turns into
        SwiGLU)."""
        if self.tp.size == 1:
            return method.apply(self, x, self.bias)
        y = self.tp.all_reduce(method.apply(self, x, None))
        return y if self.bias is None else y + self.bias

    def weight_loader(self, param: nn.Parameter, loaded, shard_id: int | None = None) -> None:
        if param.dim() == 1:  # bias: replicated
            check_shape(loaded, param.shape)
            param.data.copy_(loaded[...])
            return
        check_shape(loaded, (param.shape[0], self.in_features))
        param.data.copy_(loaded.narrow(1, self.in_start, param.shape[1])[...])
