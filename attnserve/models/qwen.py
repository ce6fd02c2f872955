"""Qwen2 (bias on q/k/v) and Qwen3 (RMSNorm on each q and k head): the Llama layout with two switches.

With ``use_sliding_window``, both window only the layers ``config.layer_types`` calls ``sliding_attention``
(transformers derives them: index >= ``max_window_layers``); windowed and full layers form two layer groups.
"""

from __future__ import annotations

from attnserve.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM


class Qwen2Attention(LlamaAttention):
    qkv_bias = True
    windows_per_layer = True


class Qwen2DecoderLayer(LlamaDecoderLayer):
    attention_cls = Qwen2Attention


class Qwen2ForCausalLM(LlamaForCausalLM):
    layer_cls = Qwen2DecoderLayer


class Qwen3Attention(LlamaAttention):
    qk_norm = True
    windows_per_layer = True


class Qwen3DecoderLayer(LlamaDecoderLayer):
    attention_cls = Qwen3Attention


class Qwen3ForCausalLM(LlamaForCausalLM):
    layer_cls = Qwen3DecoderLayer
