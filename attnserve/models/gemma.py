"""Gemma 2 and Gemma 3 (text): sliding-window layers between global ones, soft caps, four norms per layer.

Follows transformers' ``modeling_gemma2.py`` / ``modeling_gemma3.py`` numerics (and vLLM's ``gemma2.py`` /
``gemma3.py`` layout: q/k/v and gate/up fused into one matmul each):

* embeddings scaled by ``sqrt(hidden_size)`` (the factor rounded to the model dtype first, as transformers does);
* RMSNorm with ``(1 + weight)``, the product taken in float32, then rounded (:class:`GemmaRMSNorm`);
* per layer: ``h += post_attention_norm(attn(input_norm(h)))``, ``h += post_feedforward_norm(mlp(pre_feedforward_norm(h)))``;
* softmax scale ``query_pre_attn_scalar ** -0.5``; attention logits soft cap ``attn_logit_softcapping``
  (Gemma 2); final logits soft cap ``final_logit_softcapping``: ``cap * tanh(x / cap)``;
* GeGLU MLP: ``down(gelu_tanh(gate) * up)``;
* layer ``i`` is a sliding-window layer (``sliding_window`` tokens) when ``config.layer_types[i]`` is
  ``sliding_attention`` (Gemma 2: even layers; Gemma 3: five of every six, ``sliding_window_pattern``);
* Gemma 3: RMSNorm over each q and k head before RoPE, and RoPE's base per layer type
  (``rope_parameters[layer_type]``: 10,000 for local layers, ``rope_local_base_freq``; 1,000,000 for global ones).

The layers with a window and those without form two layer groups, each with its own attention backend
(``model_executor/attention_selection.py``).

Tensor parallelism (``tp``) as the Llama family's: heads (and the soft cap, q/k norms, RoPE, which act per
head) and GeGLU columns split over ranks, one all-reduce after ``o_proj`` and one after ``down_proj``,
vocabulary-split embedding and LM head (the final soft cap on the gathered logits).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from attnserve.attention.backend import AttentionLayerSpec
from attnserve.distributed.group import SINGLE, TPGroup
from attnserve.layers.activation import get_act_fn
from attnserve.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from attnserve.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from attnserve.layers.rotary import RotaryEmbedding
from attnserve.models.dims import LayerAttention, ModelDims, standard_dims
from attnserve.models.llama import AttentionFactory, LlamaForCausalLM

if TYPE_CHECKING:  # pragma: no cover
    from attnserve.attention.forward_batch import ForwardBatch

SLIDING, FULL = "sliding_attention", "full_attention"


class GemmaRMSNorm(nn.Module):
    """``(x32 * rsqrt(mean(x32^2) + eps) * (1 + w32)).to(x.dtype)``: Gemma's RMSNorm (weights stored as the
    offset from 1, the product in float32 before the one rounding)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(hidden_size))
        self.eps = eps

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * (1.0 + self.weight.float())).to(x.dtype)

    def forward(
        self,
        x: torch.Tensor,  # (..., hidden)
        residual: torch.Tensor | None = None,  # (..., hidden): normalize x + residual instead
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``norm(x)``; with ``residual``, ``(norm(x + residual), x + residual)`` (the residual add of the
        block before, as in the Llama layers)."""
        if residual is None:
            return self._norm(x)
        s = x + residual
        return self._norm(s), s


def layer_types(config) -> list[str]:
    """Each layer's ``sliding_attention`` / ``full_attention``: ``config.layer_types`` when set, else the
    pattern transformers derives (every ``sliding_window_pattern``-th layer global; Gemma 2: every 2nd)."""
    types = getattr(config, "layer_types", None)
    if types:
        return list(types)
    pattern = getattr(config, "sliding_window_pattern", None) or getattr(config, "_sliding_window_pattern", None) or 2
    return [SLIDING if (i + 1) % pattern else FULL for i in range(config.num_hidden_layers)]


def rope_of(config, layer_type: str) -> tuple[float, dict | None]:
    """RoPE base and scaling of a layer type: ``rope_parameters[layer_type]`` (transformers >= 5, Gemma 3),
    else ``rope_parameters`` / ``rope_theta`` (Gemma 2), Gemma 3's ``rope_local_base_freq`` for local layers."""
    params = getattr(config, "rope_parameters", None) or {}
    if layer_type in params:
        params = params[layer_type]
    elif layer_type == SLIDING and getattr(config, "rope_local_base_freq", None) is not None:
        params = {"rope_type": "default", "rope_theta": config.rope_local_base_freq}
    theta = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    scaling = params if params.get("rope_type", "default") != "default" else None
    return float(theta), scaling


def soft_cap(x: torch.Tensor, cap: float | None) -> torch.Tensor:
    """``cap * tanh(x / cap)`` in ``x``'s dtype (transformers' order: divide, tanh, multiply); x for None."""
    return x if cap is None else torch.tanh(x / cap) * cap


class GemmaAttention(nn.Module):
    qk_norm: bool = False  # Gemma 3: RMSNorm (1 + w) over each q and k head before RoPE

    def __init__(self, config, layer_index: int, make_attention: AttentionFactory, tp: TPGroup = SINGLE) -> None:
        super().__init__()
        total_heads, total_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_size = config.head_dim
        bias = getattr(config, "attention_bias", False)
        self.qkv_proj = QKVParallelLinear(config.hidden_size, self.head_size, total_heads, total_kv_heads, bias, tp)
        # this rank's heads
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.q_size, self.kv_size = self.qkv_proj.q_size, self.qkv_proj.kv_size
        self.o_proj = RowParallelLinear(
            total_heads * self.head_size,
            config.hidden_size,
            bias,
            tp,
            in_shard=(self.qkv_proj.head_shard.q_start * self.head_size, self.q_size),
        )
        if self.qk_norm:
            self.q_norm = GemmaRMSNorm(self.head_size, config.rms_norm_eps)
            self.k_norm = GemmaRMSNorm(self.head_size, config.rms_norm_eps)
        kind = layer_types(config)[layer_index]
        theta, scaling = rope_of(config, kind)
        self.rotary = RotaryEmbedding(self.head_size, config.max_position_embeddings, theta, scaling)
        self.attn = make_attention(
            AttentionLayerSpec(
                num_heads=self.num_heads,
                head_size=self.head_size,
                scale=config.query_pre_attn_scalar**-0.5,
                num_kv_heads=self.num_kv_heads,
                sliding_window=config.sliding_window if kind == SLIDING else None,
                logits_soft_cap=_cap(getattr(config, "attn_logit_softcapping", None)),
            ),
            layer_index,
        )

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, batch: "ForwardBatch") -> torch.Tensor:
        T = hidden.shape[0]
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(T, self.num_heads, self.head_size)
        k = k.view(T, self.num_kv_heads, self.head_size)
        v = v.view(T, self.num_kv_heads, self.head_size)
        if self.qk_norm:  # (1 + w) in float32: not the RoPE kernel's Llama-style norm, so done here
            q, k = self.q_norm(q), self.k_norm(k)
        out = self.attn.forward_with_rope(q, k, v, batch, self.rotary.inputs(positions))
        return self.o_proj(out.reshape(T, self.q_size))


class Gemma3Attention(GemmaAttention):
    qk_norm = True


class GemmaMLP(nn.Module):
    """GeGLU: ``down(act(gate) * up)`` with ``hidden_activation`` (``gelu_pytorch_tanh``)."""

    def __init__(self, config, tp: TPGroup = SINGLE) -> None:
        super().__init__()
        size = config.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(config.hidden_size, [size, size], False, tp)
        self.down_proj = RowParallelLinear(size, config.hidden_size, False, tp)
        self.act = get_act_fn(getattr(config, "hidden_activation", None) or config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (T, hidden) -> (T, hidden)
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(self.act(gate) * up)


class Gemma2DecoderLayer(nn.Module):
    attention_cls = GemmaAttention

    def __init__(self, config, layer_index: int, make_attention: AttentionFactory, tp: TPGroup = SINGLE) -> None:
        super().__init__()
        eps = config.rms_norm_eps
        self.self_attn = self.attention_cls(config, layer_index, make_attention, tp)
        self.mlp = GemmaMLP(config, tp)
        self.input_layernorm = GemmaRMSNorm(config.hidden_size, eps)
        self.post_attention_layernorm = GemmaRMSNorm(config.hidden_size, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(config.hidden_size, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(config.hidden_size, eps)

    def forward(
        self,
        positions: torch.Tensor,  # (T,) int64
        hidden: torch.Tensor,  # (T, hidden): the previous layer's output (the scaled embeddings for layer 0)
        residual: torch.Tensor | None,  # (T, hidden): the residual stream before that output; None for layer 0
        batch: "ForwardBatch",
    ) -> tuple[torch.Tensor, torch.Tensor]:  # (this layer's MLP output after its norm, the stream before it)
        if residual is None:
            hidden, residual = self.input_layernorm(hidden), hidden
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.post_attention_layernorm(self.self_attn(positions, hidden, batch))
        hidden, residual = self.pre_feedforward_layernorm(hidden, residual)
        return self.post_feedforward_layernorm(self.mlp(hidden)), residual


class Gemma3DecoderLayer(Gemma2DecoderLayer):
    attention_cls = Gemma3Attention


def _cap(value) -> float | None:
    return float(value) if value else None


class Gemma2ForCausalLM(LlamaForCausalLM):
    """Scaled embeddings, N Gemma decoder layers, final RMSNorm (1 + w), LM head (tied by default) with the
    final logits soft cap. Weight names and loading are the Llama family's."""

    layer_cls = Gemma2DecoderLayer

    def __init__(self, config, make_attention: AttentionFactory, tp: TPGroup = SINGLE) -> None:
        nn.Module.__init__(self)
        self.config = config
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, tp)
        self.layers = nn.ModuleList(
            self.layer_cls(config, i, make_attention, tp) for i in range(config.num_hidden_layers)
        )
        self.norm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", True))
        if not self.tie_word_embeddings:
            self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, tp)
        self.final_logit_softcapping = _cap(getattr(config, "final_logit_softcapping", None))
        # sqrt(hidden) rounded to the model dtype (built under the runner's default dtype and device), as
        # transformers' embed_scale.to(weight.dtype)
        self.register_buffer("normalizer", torch.tensor(config.hidden_size**0.5), persistent=False)

    @classmethod
    def dims(cls, config) -> ModelDims:
        """Llama-style dims, and each layer's window and attention soft cap (two layer groups)."""
        cap = _cap(getattr(config, "attn_logit_softcapping", None))
        layers = tuple(
            LayerAttention(config.head_dim, config.sliding_window if t == SLIDING else None, cap)
            for t in layer_types(config)
        )
        base = standard_dims(config)
        return ModelDims(
            base.num_layers,
            base.num_heads,
            base.num_kv_heads,
            config.head_dim,
            base.hidden_size,
            base.intermediate_size,
            base.vocab_size,
            sliding_window=None,
            layers=layers,
        )

    def forward(
        self,
        input_ids: torch.Tensor,  # (T,) int64
        positions: torch.Tensor,  # (T,) int64
        batch: "ForwardBatch",
    ) -> torch.Tensor:  # (T, hidden) model dtype
        hidden = self.embed_tokens(input_ids) * self.normalizer
        residual = None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual, batch)
        if residual is None:  # no layers
            return self.norm(hidden)
        return self.norm(hidden, residual)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # (N, hidden) -> (N, vocab) model dtype
        return soft_cap(super().compute_logits(hidden), self.final_logit_softcapping)

    def logits_head(self) -> VocabParallelEmbedding | None:
        """None with a final soft cap (capped logits that round to the same value tie, and the argmax must be the
        capped logits' first): no fused greedy head then."""
        return None if self.final_logit_softcapping is not None else super().logits_head()


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    """Gemma 3's text model: Gemma 2's layout with per-head q/k norms and a RoPE base per layer type."""

    layer_cls = Gemma3DecoderLayer
