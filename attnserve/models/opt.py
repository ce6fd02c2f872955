"""OPT (Zhang et al. 2022): learned positions with an offset of 2, ReLU MLP, pre- or post-LayerNorm blocks.

Follows transformers' ``models/opt/modeling_opt.py``:

* position ``p`` reads row ``p + 2`` of ``embed_positions`` (fairseq reserved the first two rows);
* ``do_layer_norm_before=True`` (all sizes but 350m) normalizes before attention and MLP and ends with a final
  LayerNorm; ``False`` (opt-350m) normalizes after each residual add and has no final LayerNorm;
* ``word_embed_proj_dim != hidden_size`` (opt-350m: 512 vs 1024) adds bias-free ``project_in`` after the
  embedding and ``project_out`` before the (tied) LM head.

Q/K/V are fused into one matmul (the loader stacks the checkpoint's three shards), as in Llama.
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

POSITION_OFFSET = 2  # OPTLearnedPositionalEmbedding.offset
_QKV_SHARDS = {"q_proj": 0, "k_proj": 1, "v_proj": 2}


def _layer_norm(config) -> nn.LayerNorm:
    return nn.LayerNorm(config.hidden_size, elementwise_affine=getattr(config, "layer_norm_elementwise_affine", True))


class OPTAttention(nn.Module):
    def __init__(self, config, layer_index: int, make_attention: AttentionFactory) -> None:
        super().__init__()
        hidden, bias = config.hidden_size, getattr(config, "enable_bias", True)
        self.num_heads = config.num_attention_heads
        self.head_size = hidden // self.num_heads
        self.qkv_proj = nn.Linear(hidden, 3 * hidden, bias=bias)
        self.out_proj = nn.Linear(hidden, hidden, bias=bias)
        spec = AttentionLayerSpec(
            num_heads=self.num_heads, head_size=self.head_size, scale=self.head_size**-0.5, num_kv_heads=self.num_heads
        )
        self.attn = make_attention(spec, layer_index)

    def forward(self, hidden: torch.Tensor, batch: "ForwardBatch") -> torch.Tensor:  # (T, hidden) -> same
        T = hidden.shape[0]
        q, k, v = self.qkv_proj(hidden).view(T, 3, self.num_heads, self.head_size).unbind(1)
        return self.out_proj(self.attn(q, k, v, batch).reshape(T, -1))


class OPTDecoderLayer(nn.Module):
    def __init__(self, config, layer_index: int, make_attention: AttentionFactory) -> None:
        super().__init__()
        bias = getattr(config, "enable_bias", True)
        self.pre_norm = config.do_layer_norm_before
        self.self_attn = OPTAttention(config, layer_index, make_attention)
        self.self_attn_layer_norm = _layer_norm(config)
        self.fc1 = nn.Linear(config.hidden_size, config.ffn_dim, bias=bias)
        self.fc2 = nn.Linear(config.ffn_dim, config.hidden_size, bias=bias)
        self.act = get_act_fn(config.activation_function)
        self.final_layer_norm = _layer_norm(config)

    def forward(self, hidden: torch.Tensor, batch: "ForwardBatch") -> torch.Tensor:
        if self.pre_norm:
            hidden = hidden + self.self_attn(self.self_attn_layer_norm(hidden), batch)
            return hidden + self.fc2(self.act(self.fc1(self.final_layer_norm(hidden))))
        hidden = self.self_attn_layer_norm(hidden + self.self_attn(hidden, batch))
        return self.final_layer_norm(hidden + self.fc2(self.act(self.fc1(hidden))))


class OPTDecoder(nn.Module):
    def __init__(self, config, make_attention: AttentionFactory) -> None:
        super().__init__()
        proj_dim = config.word_embed_proj_dim
        self.embed_tokens = nn.Embedding(config.vocab_size, proj_dim)
        self.embed_positions = nn.Embedding(config.max_position_embeddings + POSITION_OFFSET, config.hidden_size)
        if proj_dim != config.hidden_size:
            self.project_in = nn.Linear(proj_dim, config.hidden_size, bias=False)
            self.project_out = nn.Linear(config.hidden_size, proj_dim, bias=False)
        else:
            self.project_in = self.project_out = None
        self.layers = nn.ModuleList(OPTDecoderLayer(config, i, make_attention) for i in range(config.num_hidden_layers))
        has_final_norm = config.do_layer_norm_before and not getattr(config, "_remove_final_layer_norm", False)
        self.final_layer_norm = _layer_norm(config) if has_final_norm else None

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: "ForwardBatch") -> torch.Tensor:
        embeds = self.embed_tokens(input_ids)
        if self.project_in is not None:
            embeds = self.project_in(embeds)
        hidden = embeds + self.embed_positions(positions + POSITION_OFFSET)
        for layer in self.layers:
            hidden = layer(hidden, batch)
        if self.final_layer_norm is not None:
            hidden = self.final_layer_norm(hidden)
        if self.project_out is not None:
            hidden = self.project_out(hidden)
        return hidden


class OPTForCausalLM(nn.Module):
    """OPT decoder and LM head over ``word_embed_proj_dim`` (tied to the token embedding by default)."""

    def __init__(self, config, make_attention: AttentionFactory) -> None:
        super().__init__()
        self.config = config
        self.decoder = OPTDecoder(config, make_attention)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", True))
        if not self.tie_word_embeddings:
            self.lm_head = nn.Linear(config.word_embed_proj_dim, config.vocab_size, bias=False)

    @classmethod
    def dims(cls, config) -> ModelDims:
        """OPT's config has ``ffn_dim`` for the MLP width and no KV-head or head-size fields."""
        return mha_dims(config, config.ffn_dim)

    def forward(
        self,
        input_ids: torch.Tensor,  # (T,) int64
        positions: torch.Tensor,  # (T,) int64, 0-based
        batch: "ForwardBatch",
    ) -> torch.Tensor:  # (T, word_embed_proj_dim) model dtype
        return self.decoder(input_ids, positions, batch)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # (N, proj_dim) -> (N, vocab) model dtype
        weight = self.decoder.embed_tokens.weight if self.tie_word_embeddings else self.lm_head.weight
        return hidden @ weight.t()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy checkpoint tensors (``model.decoder.*`` or ``decoder.*``, ``lm_head.weight``); returns the names loaded.

        Raises KeyError naming a checkpoint tensor that has no parameter, ValueError on a shape mismatch.
        """
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for hf_name, tensor in weights:
            name = hf_name.removeprefix("model.")
            if self.tie_word_embeddings and name == "lm_head.weight":
                continue
            proj = next((p for p in _QKV_SHARDS if f".{p}." in name), None)
            if proj is None:
                copy_weight(params, name, tensor, hf_name, type(self).__name__)
                loaded.add(name)
                continue
            name, shard = name.replace(f".{proj}.", ".qkv_proj."), _QKV_SHARDS[proj]
            if name not in params:
                raise KeyError(words.no_parameter(hf_name, type(self).__name__))
            size = params[name].shape[0] // 3
            copy_weight(
                {name: params[name].data.narrow(0, shard * size, size)}, name, tensor, hf_name, type(self).__name__
            )
            loaded.add(f"{name}#{shard}")
        return loaded

    def expected_weight_names(self) -> set[str]:
        """Every name load_weights must see for a complete checkpoint (Q/K/V shards as ``qkv_proj.*#i``)."""
        names = set()
        for name, _ in self.named_parameters():
            names |= {f"{name}#{i}" for i in range(3)} if ".qkv_proj." in name else {name}
        return names
