"""Mixtral (MixtralForCausalLM): Mistral's attention (its sliding window, which may be null) and, in every
layer, ``num_local_experts`` SwiGLU experts of ``intermediate_size``, ``num_experts_per_tok`` per token, softmax then
top-k renormalized. The checkpoint's ``block_sparse_moe`` module is this model's ``mlp``."""

from __future__ import annotations

from torch import nn

from attnserve.distributed.group import TPGroup
from attnserve.models.llama import LlamaDecoderLayer
from attnserve.models.moe import MoEForCausalLM, SparseMoeBlock, make_experts


class MixtralDecoderLayer(LlamaDecoderLayer):
    def make_mlp(self, config, layer_index: int, tp: TPGroup) -> nn.Module:
        return SparseMoeBlock(config.hidden_size, make_experts(config, config.intermediate_size, tp, renormalize=True))


class MixtralForCausalLM(MoEForCausalLM):
    layer_cls = MixtralDecoderLayer
    renamed_modules = {"block_sparse_moe": "mlp"}
