"""gpt-oss (GptOssForCausalLM), bf16/fp32 weights: the Llama skeleton with

- attention: biases on q/k/v/o, head size 64, a learned sink logit per head (``sinks``: the backend's
  ``use_sinks``), a sliding window of ``sliding_window`` tokens on the layers ``layer_types`` calls
  ``sliding_attention`` (every other one in the released models), YaRN RoPE;
- MoE in every layer: router with a bias (``mlp.router``), top-k logits then a softmax over them, experts with
  biases and the clamped SwiGLU (``swiglu_limit``, ``swiglu_alpha``: ``kernels/moe.py``'s ``swigluoai``).

The released checkpoints keep their experts in MXFP4 (``quantization_config.quant_method: mxfp4``): not
supported here (refused from the config); bf16 checkpoints (e.g. dequantized ones) load.
"""

from __future__ import annotations

import copy
import dataclasses

import torch
from torch import nn

from attnserve.distributed.group import SINGLE, TPGroup
from attnserve.layers.linear import check_shape
from attnserve.models.dims import LayerAttention, ModelDims, standard_dims
from attnserve.models.llama import AttentionFactory, LlamaAttention, LlamaDecoderLayer
from attnserve.models.moe import MoEForCausalLM, SparseMoeBlock, make_experts
from attnserve.refusals import Refused
from attnserve.refusals import models as words


def layer_window(config, layer_index: int) -> int | None:
    """The layer's sliding window: ``sliding_window`` on ``sliding_attention`` layers, None on the others."""
    types = getattr(config, "layer_types", None)
    kind = types[layer_index] if types else ("sliding_attention" if layer_index % 2 == 0 else "full_attention")
    return config.sliding_window if kind == "sliding_attention" else None


def check_unquantized(config) -> None:
    """Refused (``quantization_config``) for a quantized checkpoint: only bf16/fp32 weights are read."""
    quant = getattr(config, "quantization_config", None)
    if quant:
        method = quant.get("quant_method") if isinstance(quant, dict) else getattr(quant, "quant_method", quant)
        raise Refused(words.quantized_gpt_oss(method))


class GptOssAttention(LlamaAttention):
    def __init__(self, config, layer_index: int, make_attention: AttentionFactory, tp: TPGroup = SINGLE) -> None:
        layer_config = copy.copy(config)  # this layer's window in the spec LlamaAttention builds
        layer_config.sliding_window = layer_window(config, layer_index)
        super().__init__(layer_config, layer_index, make_attention, tp)
        self.sinks = nn.Parameter(torch.empty(self.num_heads), requires_grad=False)  # this rank's heads
        self.sinks.weight_loader = self._load_sinks
        self.attn.impl.use_sinks(self.sinks)

    def _load_sinks(self, param: nn.Parameter, loaded, shard_id: int | None = None) -> None:
        check_shape(loaded, (self.qkv_proj.shards[0].full // self.head_size,))
        param.data.copy_(loaded.narrow(0, self.qkv_proj.head_shard.q_start, self.num_heads)[...])


class GptOssDecoderLayer(LlamaDecoderLayer):
    attention_cls = GptOssAttention

    def make_mlp(self, config, layer_index: int, tp: TPGroup) -> nn.Module:
        experts = make_experts(
            config,
            config.intermediate_size,
            tp,
            renormalize=True,
            softmax_after_topk=True,
            activation="swigluoai",
            bias=True,
            swiglu_alpha=getattr(config, "swiglu_alpha", 1.702),
            swiglu_limit=getattr(config, "swiglu_limit", 7.0),
        )
        return SparseMoeBlock(config.hidden_size, experts, router_bias=True, router_name="router")


class GptOssForCausalLM(MoEForCausalLM):
    layer_cls = GptOssDecoderLayer

    def __init__(self, config, make_attention: AttentionFactory, tp: TPGroup = SINGLE) -> None:
        check_unquantized(config)
        super().__init__(config, make_attention, tp)

    @classmethod
    def dims(cls, config) -> ModelDims:
        """Head size, sinks, and each layer's sliding window (windowed and full layers form two layer groups)."""
        check_unquantized(config)
        base = dataclasses.replace(standard_dims(config), has_sink=True)
        windows = [layer_window(config, i) for i in range(config.num_hidden_layers)]
        kinds = tuple(LayerAttention(base.head_size, w, has_sink=True) for w in windows)
        return dataclasses.replace(base, sliding_window=windows[0], layers=kinds)
