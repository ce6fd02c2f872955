"""GPT-2 (Radford et al. 2019): learned absolute positions, pre-LayerNorm blocks, GELU (tanh) MLP, tied LM head.

Follows transformers' ``models/gpt2/modeling_gpt2.py``. Module names mirror the checkpoint's (``h.N.attn.c_attn``)
so that loading is a rename-free copy. The checkpoint stores its projections as ``Conv1D`` weights,
``(in_features, out_features)``; they are transposed into ``nn.Linear``'s ``(out, in)`` on load.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch
from torch import nn

from attnserve.attention.backend import AttentionLayerSpec
from attnserve.layers.activation import get_act_fn
from attnserve.models.dims import ModelDims, mha_dims
from attnserve.models.llama import AttentionFactory
from attnserve.models.weight_utils import copy_weight
from attnserve.refusals import models as words

if TYPE_CHECKING:  # pragma: no cover
    from attnserve.attention.forward_batch import ForwardBatch

# checkpoint weights stored as Conv1D (in, out): transposed to nn.Linear's (out, in) on load
_CONV1D_WEIGHTS = (".c_attn.weight", ".c_proj.weight", ".c_fc.weight")
# causal-mask buffers that old checkpoints saved beside the weights
_IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")


def _intermediate_size(config) -> int:
    return getattr(config, "n_inner", None) or 4 * config.hidden_size


class GPT2Attention(nn.Module):
    """Multi-head self-attention with one fused QKV projection (``c_attn``) and biases everywhere."""

    def __init__(self, config, layer_index: int, make_attention: AttentionFactory) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.head_size = hidden // self.num_heads
        self.c_attn = nn.Linear(hidden, 3 * hidden)
        self.c_proj = nn.Linear(hidden, hidden)
        scale = self.head_size**-0.5 if getattr(config, "scale_attn_weights", True) else 1.0
        if getattr(config, "scale_attn_by_inverse_layer_idx", False):
            scale /= float(layer_index + 1)
        spec = AttentionLayerSpec(
            num_heads=self.num_heads, head_size=self.head_size, scale=scale, num_kv_heads=self.num_heads
        )
        self.attn = make_attention(spec, layer_index)

    def forward(self, hidden: torch.Tensor, batch: "ForwardBatch") -> torch.Tensor:  # (T, hidden) -> same
        T = hidden.shape[0]
        q, k, v = self.c_attn(hidden).view(T, 3, self.num_heads, self.head_size).unbind(1)
        return self.c_proj(self.attn(q, k, v, batch).reshape(T, -1))


class GPT2MLP(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.hidden_size, _intermediate_size(config))
        self.c_proj = nn.Linear(_intermediate_size(config), config.hidden_size)
        self.act = get_act_fn(getattr(config, "activation_function", "gelu_new"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.act(self.c_fc(x)))


class GPT2Block(nn.Module):
    def __init__(self, config, layer_index: int, make_attention: AttentionFactory) -> None:
        super().__init__()
        eps = config.layer_norm_epsilon
        self.ln_1 = nn.LayerNorm(config.hidden_size, eps=eps)
        self.attn = GPT2Attention(config, layer_index, make_attention)
        self.ln_2 = nn.LayerNorm(config.hidden_size, eps=eps)
        self.mlp = GPT2MLP(config)

    def forward(self, hidden: torch.Tensor, batch: "ForwardBatch") -> torch.Tensor:
        hidden = hidden + self.attn(self.ln_1(hidden), batch)
        return hidden + self.mlp(self.ln_2(hidden))


class GPT2LMHeadModel(nn.Module):
    """Token + learned position embeddings, N pre-LayerNorm blocks, final LayerNorm, LM head (tied by default)."""

    def __init__(self, config, make_attention: AttentionFactory) -> None:
        super().__init__()
        if getattr(config, "add_cross_attention", False):
            raise ValueError(words.CROSS_ATTENTION)
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.hidden_size)
        self.wpe = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.h = nn.ModuleList(GPT2Block(config, i, make_attention) for i in range(config.num_hidden_layers))
        self.ln_f = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_epsilon)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", True))
        if not self.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    @classmethod
    def dims(cls, config) -> ModelDims:
        """GPT-2's config names: ``n_layer``, ``n_head``, ``n_embd``, ``n_inner`` (aliased by transformers)."""
        return mha_dims(config, _intermediate_size(config))

    def forward(
        self,
        input_ids: torch.Tensor,  # (T,) int64
        positions: torch.Tensor,  # (T,) int64, 0-based
        batch: "ForwardBatch",
    ) -> torch.Tensor:  # (T, hidden) model dtype
        hidden = self.wte(input_ids) + self.wpe(positions)
        for block in self.h:
            hidden = block(hidden, batch)
        return self.ln_f(hidden)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # (N, hidden) -> (N, vocab) model dtype
        weight = self.wte.weight if self.tie_word_embeddings else self.lm_head.weight
        return hidden @ weight.t()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy checkpoint tensors (Hugging Face names, with or without ``transformer.``); returns the names loaded.

        Raises KeyError naming a checkpoint tensor that has no parameter, ValueError on a shape mismatch.
        """
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for hf_name, tensor in weights:
            name = hf_name.removeprefix("transformer.")
            if name.endswith(_IGNORED_SUFFIXES) or (self.tie_word_embeddings and name == "lm_head.weight"):
                continue
            if name.endswith(_CONV1D_WEIGHTS):
                tensor = tensor.t()
            copy_weight(params, name, tensor, hf_name, type(self).__name__)
            loaded.add(name)
        return loaded

    def expected_weight_names(self) -> set[str]:
        """Every parameter name load_weights must see for a complete checkpoint."""
        return {name for name, _ in self.named_parameters()}
