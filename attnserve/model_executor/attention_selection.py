"""The attention backends of a model, chosen from its Hugging Face config alone (no weights, no tokenizer).

    attention = select_model_attention(engine_config, hf_config, tensor_parallel_size)
    attention.groups[0].selector_config, attention.groups[0].selection, attention.describe()

Layers whose attention differs in what a backend must support (head size, sliding window, logits soft cap,
sinks: ``ModelDims.layer_attention``) form layer groups, in order of their first layer; each group gets its own
backend from one selection, with its own reasons (Gemma 2: the sliding-window layers and the global ones).

Called twice with the same inputs: by the engine right after it reads the model's config, so that a backend
that cannot run the model is refused before the GGUF parse, the tokenizer, worker processes and the weights;
then by each ModelRunner, which builds its layers with the result. In the engine's process the runner's
call returns the engine's selection (``select_attn_backend`` caches per input); a tensor-parallel worker
repeats it on its own device with the same record (rank 0's head counts).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from attnserve.attention.selector import (
    AttentionSelection,
    AttentionSelectorConfig,
    NoUsableBackendError,
    select_attn_backend,
)
from attnserve.config.engine import EngineConfig
from attnserve.config.engine_args import log_unused_options_once
from attnserve.distributed.sharding import shard_heads
from attnserve.model_executor.loader import resolve_dtype
from attnserve.models.dims import LayerAttention
from attnserve.models.registry import get_model_class
from attnserve.platforms import detect_platform


def layer_list(layers: tuple[int, ...]) -> str:
    """``(0, 1, 2, 3, 5, 7)`` -> ``"0-3, 5, 7"``; ``(1, 3, 5, 7, 9)`` -> ``"1, 3, ..., 9"`` (one step throughout)."""
    steps = {b - a for a, b in zip(layers, layers[1:])}
    if len(layers) > 3 and len(steps) == 1 and steps != {1}:
        return f"{layers[0]}, {layers[1]}, ..., {layers[-1]}"
    runs: list[list[int]] = []
    for i in layers:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 2 else ", ".join(map(str, r)) for r in runs)


def layer_group_name(index: int, layers: tuple[int, ...], kind: LayerAttention) -> str:
    """E.g. ``layer group 1 (layers 1, 3, 5: head_size 256, logits_soft_cap 50.0)``."""
    word = "layer" if len(layers) == 1 else "layers"
    return f"layer group {index} ({word} {layer_list(layers)}: {kind.describe()})"


@dataclass(frozen=True)
class AttentionGroup:
    """Layers whose attention needs the same backend features, and the backend chosen for them."""

    index: int
    layers: tuple[int, ...]  # layer indices, ascending
    kind: LayerAttention
    selector_config: AttentionSelectorConfig
    selection: AttentionSelection

    def describe(self) -> str:
        """E.g. ``layer group 1 (layers 1, 3, 5: head_size 256, logits_soft_cap 50.0)``."""
        return layer_group_name(self.index, self.layers, self.kind)


@dataclass(frozen=True)
class ModelAttention:
    """Every layer group of a model with its backend; one group when all layers are alike."""

    groups: tuple[AttentionGroup, ...]

    @property
    def backend_names(self) -> tuple[str, ...]:
        """Each group's backend name, in group order."""
        return tuple(g.selection.name for g in self.groups)

    def group_of(self, layer_index: int) -> AttentionGroup:
        for g in self.groups:
            if layer_index in g.layers:
                return g
        raise IndexError(f"layer {layer_index} is in no attention group")

    def describe(self) -> str:
        """The start-up line: ``layer group 0 (layers 0, 2: ...): FLASH_ATTN; layer group 1 (...): FLASH_ATTN``."""
        return "; ".join(f"{g.describe()}: {g.selection.name}" for g in self.groups)


def layer_groups(kinds: tuple[LayerAttention, ...]) -> list[tuple[LayerAttention, tuple[int, ...]]]:
    """Equal records grouped, in order of their first layer: ``[(kind, (layer, ...)), ...]``."""
    groups: dict[LayerAttention, list[int]] = {}
    for i, kind in enumerate(kinds):
        groups.setdefault(kind, []).append(i)
    return [(kind, tuple(layers)) for kind, layers in groups.items()]


def attention_selector_configs(
    config: EngineConfig, hf_config, device_type: str, tensor_parallel_size: int
) -> list[tuple[LayerAttention, tuple[int, ...], AttentionSelectorConfig]]:
    """What a backend must support to run each layer group: its head size, sliding window, soft cap and sinks
    (the model class's ``dims``), the dtype ``resolve_dtype`` gives on ``device_type``, the KV-cache dtype and
    block size; under tensor parallelism rank 0's head counts (rank 0 has the most: uneven splits give the
    first ranks one more), so that every rank judges the same records and picks the same backends.

    Raises ValueError for an unsupported architecture, for one not built for tensor parallelism when
    ``tensor_parallel_size`` > 1, and for heads the ranks cannot split.
    """
    tp = tensor_parallel_size
    dims = get_model_class(hf_config, tp).dims(hf_config)
    head0 = shard_heads(dims.num_heads, dims.num_kv_heads, tp, 0)
    dtype = resolve_dtype(config.model.dtype, hf_config, device_type)
    return [
        (
            kind,
            layers,
            AttentionSelectorConfig(
                head_size=kind.head_size,
                dtype=dtype,
                kv_cache_dtype=config.cache.kv_cache_dtype,
                block_size=config.cache.block_size,
                sliding_window=kind.sliding_window,
                logits_soft_cap=kind.logits_soft_cap,
                has_sink=kind.has_sink,
                num_heads=head0.num_heads if tp > 1 else None,
                num_kv_heads=head0.num_kv_heads if tp > 1 else None,
            ),
        )
        for kind, layers in layer_groups(dims.layer_attention())
    ]


def for_group(error: NoUsableBackendError, group_name: str) -> NoUsableBackendError:
    """``error`` (a refusal for "this model") said of one layer group: ``... cannot run layer group 1 (layers
    1, 3: ...) of this model (...)``."""
    reason = error.refusal.reason.replace("this model", f"{group_name} of this model", 1)
    return NoUsableBackendError(dataclasses.replace(error.refusal, reason=reason), error.reasons)


def select_model_attention(config: EngineConfig, hf_config, tensor_parallel_size: int) -> ModelAttention:
    """Each layer group of :func:`attention_selector_configs` on ``config.device``'s platform with the backend
    ``select_attn_backend`` chooses for it with ``config.attention``.

    Raises NoUsableBackendError (a ValueError) with every reason; with several groups its message names the
    first group that no backend (or not the explicitly chosen one) can serve, with the backends that would
    serve it. Also :func:`attention_selector_configs`' errors.
    """
    platform = detect_platform(config.device)
    records = attention_selector_configs(config, hf_config, platform.device_type, tensor_parallel_size)
    groups = []
    for i, (kind, layers, selector_config) in enumerate(records):
        try:
            selection = select_attn_backend(config.attention, selector_config, platform)
        except NoUsableBackendError as e:
            if len(records) == 1:
                raise
            raise for_group(e, layer_group_name(i, layers, kind)) from None
        if config.attention.backend is None:  # an explicit backend's unused options were logged with the config
            unused = config.attention.unused_options(selection.name)
            if unused:
                log_unused_options_once(selection.name, tuple(unused))
        groups.append(AttentionGroup(i, layers, kind, selector_config, selection))
    return ModelAttention(tuple(groups))
