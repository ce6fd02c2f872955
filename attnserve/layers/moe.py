"""FusedMoE: a mixture-of-experts layer's expert weights and its forward (routing, experts, all-reduce).

Tensor parallelism as vLLM's (``fused_moe/layer.py`` without expert parallelism): every rank holds every
expert, with its share of each expert's intermediate dimension: ``w13`` column-parallel (this rank's gate
rows, then its up rows), ``w2`` row-parallel (the matching input columns). Each rank's experts give a partial
sum of the output, and one all-reduce adds them; ``w2``'s bias is added on rank 0 only, so it counts once.
The router (``gate``) is replicated: a model computes the router logits and passes them in.

Loading: ``w13_weight`` / ``w2_weight`` (and their biases) carry ``weight_loader(param, loaded, shard_id,
expert_id)`` with ``shard_id`` ``"w1"`` (gate), ``"w3"`` (up) or ``"w2"`` (down) and the full checkpoint
tensor of one expert (Mixtral and Qwen3-MoE store experts one by one); ``expert_id`` None means ``loaded``
holds every expert stacked in its first dimension (gpt-oss).
"""

from __future__ import annotations

import torch
from torch import nn

from attnserve.distributed.group import SINGLE, TPGroup
from attnserve.distributed.sharding import shard_range
from attnserve.kernels.moe import ACTIVATIONS, fused_experts, topk_routing
from attnserve.layers.linear import check_shape
from attnserve.refusals import models as words


class FusedMoE(nn.Module):
    """``num_experts`` experts of ``hidden_size -> intermediate_size -> hidden_size``, ``top_k`` per token."""

    def __init__(
        self,
        num_experts: int,
        top_k: int,
        hidden_size: int,
        intermediate_size: int,
        renormalize: bool = True,
        softmax_after_topk: bool = False,
        activation: str = "silu",
        bias: bool = False,
        swiglu_alpha: float = 1.702,
        swiglu_limit: float = 7.0,
        tp: TPGroup = SINGLE,
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(words.not_supported("activation", activation, ACTIVATIONS))
        self.num_experts, self.top_k = num_experts, top_k
        self.renormalize, self.softmax_after_topk = renormalize, softmax_after_topk
        self.activation, self.alpha, self.limit = activation, swiglu_alpha, swiglu_limit
        self.tp = tp
        self.intermediate_size = intermediate_size  # each expert's, all ranks
        self.i_start, self.i_local = shard_range(intermediate_size, tp.size, tp.rank)
        self.w13_weight = _param(num_experts, 2 * self.i_local, hidden_size)
        self.w2_weight = _param(num_experts, hidden_size, self.i_local)
        self.w13_bias = _param(num_experts, 2 * self.i_local) if bias else None
        self.w2_bias = _param(num_experts, hidden_size) if bias else None
        for p in (self.w13_weight, self.w2_weight, self.w13_bias, self.w2_bias):
            if p is not None:
                p.weight_loader = self.weight_loader

    def forward(
        self,
        hidden: torch.Tensor,  # (T, H)
        router_logits: torch.Tensor,  # (T, E)
    ) -> torch.Tensor:  # (T, H), summed over ranks
        weights, ids = topk_routing(router_logits, self.top_k, self.renormalize, self.softmax_after_topk)
        out = fused_experts(
            hidden,
            self.w13_weight,
            self.w2_weight,
            weights,
            ids,
            self.activation,
            self.w13_bias,
            self.w2_bias if self.tp.rank == 0 else None,
            self.alpha,
            self.limit,
        )
        return self.tp.all_reduce(out)

    def weight_loader(self, param: nn.Parameter, loaded, shard_id: str, expert_id: int | None = None) -> None:
        """Copy this rank's part of one checkpoint tensor: ``shard_id`` ``"w1"`` / ``"w3"`` (gate / up rows of
        ``w13``: checkpoint (I, H) per expert, bias (I,)) or ``"w2"`` (down: (H, I), bias (H,)); ``expert_id``
        None: ``loaded`` has a leading expert dimension. Raises CheckpointShapeError on a shape mismatch."""
        if expert_id is None:
            stacked = loaded[...]  # every expert read whole, then narrowed per expert
            check_shape(stacked, (self.num_experts, *stacked.shape[1:]))
            for e in range(self.num_experts):
                self.weight_loader(param, stacked[e], shard_id, e)
            return
        target = param.data[expert_id]
        I, i0, n = self.intermediate_size, self.i_start, self.i_local
        if shard_id in ("w1", "w3"):
            check_shape(loaded, (I, *target.shape[1:]))
            row = 0 if shard_id == "w1" else n
            target.narrow(0, row, n).copy_(loaded.narrow(0, i0, n)[...])
        elif shard_id == "w2":
            if param.dim() == 2:  # bias: replicated
                check_shape(loaded, target.shape)
                target.copy_(loaded[...])
                return
            check_shape(loaded, (target.shape[0], I))
            target.copy_(loaded.narrow(1, i0, n)[...])
        else:
            raise ValueError(words.bad_shard(shard_id, "w1, w2, w3"))


def _param(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape), requires_grad=False)
