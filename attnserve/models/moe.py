"""What the mixture-of-experts models share: the sparse MoE block (a replicated router and ``FusedMoE``) and
the loading of expert tensors into the fused ``w13`` / ``w2`` parameters.

Checkpoint layouts (Hugging Face names, after ``model.``):

- one tensor per expert (Qwen3-MoE ``mlp.experts.E.{gate,up,down}_proj.weight``; Mixtral
  ``block_sparse_moe.experts.E.{w1,w3,w2}.weight``, its block read as ``mlp``);
- every expert stacked (gpt-oss ``mlp.experts.gate_up_proj`` (E, H, 2I) with gate and up interleaved in the
  last dimension, ``gate_up_proj_bias`` (E, 2I), ``down_proj`` (E, I, H), ``down_proj_bias`` (E, H)).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from attnserve.distributed.group import SINGLE, TPGroup
from attnserve.layers.linear import ColumnParallelLinear
from attnserve.layers.moe import FusedMoE
from attnserve.models.llama import LlamaForCausalLM
from attnserve.models.weight_utils import in_tensor
from attnserve.refusals import models as words

# per-expert checkpoint tensor -> (FusedMoE parameter, shard id)
_PER_EXPERT = re.compile(
    r"^(?P<prefix>.*\.experts)\.(?P<expert>\d+)\.(?P<proj>gate_proj|up_proj|down_proj|w1|w2|w3)"
    r"\.(?P<kind>weight|bias)$"
)
_SHARD = {"gate_proj": "w1", "w1": "w1", "up_proj": "w3", "w3": "w3", "down_proj": "w2", "w2": "w2"}
_STACKED = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<proj>gate_up_proj|down_proj)(?P<bias>_bias)?$")


class SparseMoeBlock(nn.Module):
    """``experts(x, router(x))``: the router (``router_name``: ``gate`` or gpt-oss's ``router``) is one replicated
    linear layer, (T, H) -> (T, E) logits in the model dtype."""

    def __init__(
        self, hidden_size: int, experts: FusedMoE, router_bias: bool = False, router_name: str = "gate"
    ) -> None:
        super().__init__()
        self.router_name = router_name
        self.add_module(router_name, ColumnParallelLinear(hidden_size, experts.num_experts, router_bias, SINGLE))
        self.experts = experts

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (T, H) -> (T, H)
        return self.experts(x, getattr(self, self.router_name)(x))


def num_experts_of(config) -> int:
    """``num_experts`` (Qwen3-MoE) or ``num_local_experts`` (Mixtral, gpt-oss)."""
    return getattr(config, "num_experts", None) or config.num_local_experts


def make_experts(config, intermediate_size: int, tp: TPGroup = SINGLE, **kwargs) -> FusedMoE:
    return FusedMoE(
        num_experts_of(config), config.num_experts_per_tok, config.hidden_size, intermediate_size, tp=tp, **kwargs
    )


class MoEForCausalLM(LlamaForCausalLM):
    """The Llama skeleton whose layers' MLPs may be ``SparseMoeBlock``s; loads expert tensors into them."""

    # checkpoint module name -> this model's (Mixtral's "block_sparse_moe" is "mlp" here)
    renamed_modules: dict[str, str] = {}

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """LlamaForCausalLM.load_weights, with expert tensors copied into the fused parameters (loaded names
        ``...experts.w13_weight#E#w1`` and alike)."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()

        def rest() -> Iterator[tuple[str, torch.Tensor]]:
            for hf_name, tensor in weights:
                name = hf_name.removeprefix("model.")
                for old, new in self.renamed_modules.items():
                    name = name.replace(f".{old}.", f".{new}.")
                targets = _expert_targets(name, tensor)
                if targets is None:
                    yield name, tensor
                    continue
                for param_name, shard, expert, part in targets:
                    if param_name not in params:
                        raise KeyError(words.no_parameter(hf_name, type(self).__name__))
                    param = params[param_name]
                    try:
                        param.weight_loader(param, part, shard, expert)
                    except ValueError as e:
                        raise in_tensor(e, hf_name) from None
                    experts = range(self.config_num_experts) if expert is None else [expert]
                    loaded.update(f"{param_name}#{e}#{shard}" for e in experts)

        loaded |= super().load_weights(rest())
        return loaded

    @property
    def config_num_experts(self) -> int:
        return num_experts_of(self.config)

    def expected_weight_names(self) -> set[str]:
        names = set()
        for name in super().expected_weight_names():
            if not name.startswith(tuple(f"{p}." for p in self._moe_prefixes())):
                names.add(name)
                continue
            shards = ("w1", "w3") if name.split(".")[-1].startswith("w13") else ("w2",)
            names |= {f"{name}#{e}#{s}" for e in range(self.config_num_experts) for s in shards}
        return names

    def _moe_prefixes(self) -> list[str]:
        return [name for name, m in self.named_modules() if isinstance(m, FusedMoE)]


def _expert_targets(name: str, tensor) -> list[tuple[str, str, int | None, object]] | None:
    """``(parameter, shard id, expert or None for all, tensor)`` for an expert tensor's parts; None otherwise."""
    m = _PER_EXPERT.match(name)
    if m:
        suffix = "weight" if m["kind"] == "weight" else "bias"
        group = "w2" if _SHARD[m["proj"]] == "w2" else "w13"
        return [(f"{m['prefix']}.{group}_{suffix}", _SHARD[m["proj"]], int(m["expert"]), tensor)]
    m = _STACKED.match(name)
    if m is None:
        return None
    t = tensor[...]
    if m["proj"] == "down_proj":
        if m["bias"]:
            return [(f"{m['prefix']}.w2_bias", "w2", None, t)]
        return [(f"{m['prefix']}.w2_weight", "w2", None, t.transpose(1, 2))]  # (E, I, H) -> (E, H, I)
    if m["bias"]:  # (E, 2I), gate and up interleaved
        return [
            (f"{m['prefix']}.w13_bias", "w1", None, t[:, 0::2]),
            (f"{m['prefix']}.w13_bias", "w3", None, t[:, 1::2]),
        ]
    t = t.transpose(1, 2)  # (E, H, 2I) -> (E, 2I, H), rows interleaved gate, up
    return [
        (f"{m['prefix']}.w13_weight", "w1", None, t[:, 0::2]),
        (f"{m['prefix']}.w13_weight", "w3", None, t[:, 1::2]),
    ]
