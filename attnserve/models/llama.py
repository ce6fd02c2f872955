"""The Llama family: Llama 2/3, Mistral, SmolLM2; with options that Qwen2 (QKV bias) and Qwen3 (q/k norm) reuse.

Follows transformers' ``modeling_llama.py`` numerics, with q/k/v and gate/up fused into one matmul each
(vLLM's QKVParallelLinear / MergedColumnParallelLinear; the loader stacks the checkpoint's shards).

Tensor parallelism (``tp``): heads and MLP columns split over ranks (``attnserve/layers/linear.py``), one
all-reduce after ``o_proj`` and one after ``down_proj``, vocabulary-split embedding and LM head. With one
rank the layers are plain ``F.linear`` / ``F.embedding``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import torch
from torch import nn

from attnserve.attention.backend import AttentionLayerSpec
from attnserve.attention.layer import Attention
from attnserve.distributed.group import SINGLE, TPGroup
from attnserve.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from attnserve.layers.linear import QKVParallelLinear, RowParallelLinear
from attnserve.layers.mlp import SwiGLUMLP
from attnserve.layers.norm import RMSNorm
from attnserve.layers.rotary import RotaryEmbedding
from attnserve.models.weight_utils import copy_weight, in_tensor
from attnserve.models.dims import (
    ModelDims,
    head_size_of,
    layer_types_windows,
    per_layer_window_dims,
    sliding_window_of,
    standard_dims,
)
from attnserve.refusals import models as words

if TYPE_CHECKING:  # pragma: no cover
    from attnserve.attention.forward_batch import ForwardBatch

# builds a layer's Attention module from its spec and layer index (given by the model runner)
AttentionFactory = Callable[[AttentionLayerSpec, int], Attention]


class LlamaAttention(nn.Module):
    qkv_bias: bool = False  # Qwen2 sets True (bias on q/k/v, none on o)
    qk_norm: bool = False  # Qwen3 sets True (RMSNorm over each head of q and k, before RoPE)
    # True: each layer's window from config.layer_types (Qwen2, Qwen3: transformers windows only the layers from
    # max_window_layers on); False: the config's one window on every layer (Mistral, Mixtral, Qwen3-MoE)
    windows_per_layer: bool = False

    def __init__(self, config, layer_index: int, make_attention: AttentionFactory, tp: TPGroup = SINGLE) -> None:
        super().__init__()
        total_heads = config.num_attention_heads
        total_kv_heads = getattr(config, "num_key_value_heads", None) or total_heads
        self.head_size = head_size_of(config)
        bias = self.qkv_bias or getattr(config, "attention_bias", False)
        self.qkv_proj = QKVParallelLinear(config.hidden_size, self.head_size, total_heads, total_kv_heads, bias, tp)
        # this rank's heads
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.q_size, self.kv_size = self.qkv_proj.q_size, self.qkv_proj.kv_size
        self.o_proj = RowParallelLinear(
            total_heads * self.head_size,
            config.hidden_size,
            getattr(config, "attention_bias", False),
            tp,
            in_shard=(self.qkv_proj.head_shard.q_start * self.head_size, self.q_size),
        )
        if self.qk_norm:
            self.q_norm = RMSNorm(self.head_size, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_size, config.rms_norm_eps)
        rope_params = getattr(config, "rope_parameters", None) or {}
        theta = rope_params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        scaling = getattr(config, "rope_scaling", None) or (
            rope_params if rope_params.get("rope_type", "default") != "default" else None
        )
        self.rotary = RotaryEmbedding(self.head_size, config.max_position_embeddings, theta, scaling)
        spec = AttentionLayerSpec(
            num_heads=self.num_heads,
            head_size=self.head_size,
            scale=self.head_size**-0.5,
            num_kv_heads=self.num_kv_heads,
            sliding_window=layer_types_windows(config)[layer_index]
            if self.windows_per_layer
            else sliding_window_of(config),
        )
        self.attn = make_attention(spec, layer_index)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, batch: "ForwardBatch") -> torch.Tensor:
        T = hidden.shape[0]
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(T, self.num_heads, self.head_size)
        k = k.view(T, self.num_kv_heads, self.head_size)
        v = v.view(T, self.num_kv_heads, self.head_size)
        # RoPE in place (Qwen3: after the per-head q/k RMSNorm, in the same launch), which also writes k and
        # v into the paged KV cache where the backend allows it, then attention
        norms = (self.q_norm, self.k_norm) if self.qk_norm else (None, None)
        out = self.attn.forward_with_rope(q, k, v, batch, self.rotary.inputs(positions, *norms))
        return self.o_proj(out.reshape(T, self.q_size))


class LlamaMLP(SwiGLUMLP):
    """The config's SwiGLU MLP (``hidden_act`` silu; ``mlp_bias``)."""

    def __init__(self, config, tp: TPGroup = SINGLE) -> None:
        super().__init__(config.hidden_size, config.intermediate_size, getattr(config, "mlp_bias", False), tp)
        if getattr(config, "hidden_act", "silu") != "silu":
            raise ValueError(words.not_supported("hidden_act", config.hidden_act, ["silu"]))


class LlamaDecoderLayer(nn.Module):
    attention_cls = LlamaAttention

    def __init__(self, config, layer_index: int, make_attention: AttentionFactory, tp: TPGroup = SINGLE) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = self.attention_cls(config, layer_index, make_attention, tp)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = self.make_mlp(config, layer_index, tp)

    def make_mlp(self, config, layer_index: int, tp: TPGroup) -> nn.Module:
        """The layer's feed-forward block, (T, hidden) -> (T, hidden) (mixture-of-experts models override it)."""
        return LlamaMLP(config, tp)

    def forward(
        self,
        positions: torch.Tensor,  # (T,) int64
        hidden: torch.Tensor,  # (T, hidden): the previous layer's MLP output (the embeddings for layer 0)
        residual: torch.Tensor | None,  # (T, hidden): the residual stream before that output; None for layer 0
        batch: "ForwardBatch",
    ) -> tuple[torch.Tensor, torch.Tensor]:  # (this layer's MLP output, the residual stream before it)
        """HF's ``h = h + attn(norm(h)); h = h + mlp(norm(h))`` with each residual add done by the next
        norm's kernel (vLLM's residual passing): the stream is ``residual + hidden``, the same sums in the
        same order, so the same roundings."""
        if residual is None:
            hidden, residual = self.input_layernorm(hidden), hidden
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden, batch)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaForCausalLM(nn.Module):
    """Decoder-only transformer: embeddings, N pre-norm decoder layers, final RMSNorm, LM head."""

    layer_cls = LlamaDecoderLayer
    # checkpoint shard name -> (fused parameter name, shard index)
    stacked_params = {
        "q_proj": ("qkv_proj", 0),
        "k_proj": ("qkv_proj", 1),
        "v_proj": ("qkv_proj", 2),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }

    supports_tensor_parallel = True

    def __init__(self, config, make_attention: AttentionFactory, tp: TPGroup = SINGLE) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, tp)
        self.layers = nn.ModuleList(
            self.layer_cls(config, i, make_attention, tp) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        if not self.tie_word_embeddings:
            self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, tp)

    @classmethod
    def dims(cls, config) -> ModelDims:
        """Layer count, KV heads, head size and sliding window (per layer where the attention class says), for
        the runner's KV cache and backend choice."""
        if cls.layer_cls.attention_cls.windows_per_layer:
            return per_layer_window_dims(config)
        return standard_dims(config)

    def forward(
        self,
        input_ids: torch.Tensor,  # (T,) int64
        positions: torch.Tensor,  # (T,) int64
        batch: "ForwardBatch",
    ) -> torch.Tensor:  # (T, hidden) model dtype
        hidden, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual, batch)
        if residual is None:  # no layers
            return self.norm(hidden)
        return self.norm(hidden, residual)[0]  # the last residual add, fused into the final norm

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # (N, hidden) -> (N, vocab) model dtype
        return (self.embed_tokens if self.tie_word_embeddings else self.lm_head).logits(hidden)

    def logits_head(self) -> VocabParallelEmbedding | None:
        """The module whose ``logits(hidden)`` are :meth:`compute_logits` unchanged (the embedding when tied):
        what a fused LM head + argmax (the GEMV plan's greedy head) may stand in for."""
        return self.embed_tokens if self.tie_word_embeddings else self.lm_head

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy checkpoint tensors (Hugging Face names) into the parameters; returns the names loaded.

        Raises KeyError naming a checkpoint tensor that has no parameter, ValueError on a shape mismatch.
        """
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for hf_name, tensor in weights:
            name = hf_name.removeprefix("model.")
            if "rotary_emb.inv_freq" in name or (self.tie_word_embeddings and name == "lm_head.weight"):
                continue
            shard = None
            for ckpt, (fused, index) in self.stacked_params.items():
                if f".{ckpt}." in name:
                    name, shard = name.replace(f".{ckpt}.", f".{fused}."), index
                    break
            loader = getattr(params.get(name), "weight_loader", None)
            if loader is None:
                copy_weight(params, name, tensor, hf_name, type(self).__name__)
            else:
                try:  # narrows the full checkpoint tensor to this rank's rows / columns
                    loader(params[name], tensor, shard)
                except ValueError as e:
                    raise in_tensor(e, hf_name) from None
            loaded.add(name if shard is None else f"{name}#{shard}")
        return loaded

    def expected_weight_names(self) -> set[str]:
        """Every name load_weights must see for a complete checkpoint (fused shards as ``name#i``)."""
        names = set()
        for name, _ in self.named_parameters():
            if ".qkv_proj." in name:
                names |= {f"{name}#{i}" for i in range(3)}
            elif ".gate_up_proj." in name:
                names |= {f"{name}#{i}" for i in range(2)}
            else:
                names.add(name)
        return names
