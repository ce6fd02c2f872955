"""Qwen3-MoE (Qwen3MoeForCausalLM): Qwen3's attention (q/k RMSNorm), experts in place of the MLP.

A layer is sparse unless it is listed in ``mlp_only_layers`` or ``(index + 1) % decoder_sparse_step != 0``
(transformers' rule); a sparse layer has ``num_experts`` experts of ``moe_intermediate_size``, ``num_experts_per_tok``
per token, softmax-then-top-k routing renormalized when ``norm_topk_prob``; a dense layer is Qwen3's SwiGLU MLP of
``intermediate_size``. No shared expert.
"""

from __future__ import annotations

from torch import nn

from attnserve.distributed.group import TPGroup
from attnserve.models.llama import LlamaDecoderLayer, LlamaMLP
from attnserve.models.moe import MoEForCausalLM, SparseMoeBlock, make_experts, num_experts_of
from attnserve.models.qwen import Qwen3Attention


def is_sparse_layer(config, layer_index: int) -> bool:
    step = getattr(config, "decoder_sparse_step", 1) or 1
    return (
        layer_index not in (getattr(config, "mlp_only_layers", None) or [])
        and num_experts_of(config) > 0
        and (layer_index + 1) % step == 0
    )


class Qwen3MoeAttention(Qwen3Attention):
    # transformers' Qwen3-MoE has no layer_types: with use_sliding_window every layer slides (its checkpoints'
    # max_window_layers is read by nothing)
    windows_per_layer = False


class Qwen3MoeDecoderLayer(LlamaDecoderLayer):
    attention_cls = Qwen3MoeAttention

    def make_mlp(self, config, layer_index: int, tp: TPGroup) -> nn.Module:
        if not is_sparse_layer(config, layer_index):
            return LlamaMLP(config, tp)
        experts = make_experts(
            config, config.moe_intermediate_size, tp, renormalize=bool(getattr(config, "norm_topk_prob", False))
        )
        return SparseMoeBlock(config.hidden_size, experts)


class Qwen3MoeForCausalLM(MoEForCausalLM):
    layer_cls = Qwen3MoeDecoderLayer
