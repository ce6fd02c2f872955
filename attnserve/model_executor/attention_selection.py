"""The attention backend of a model, chosen from its Hugging Face config alone (no weights, no tokenizer).

    selector_config, selection = select_model_attention(engine_config, hf_config, tensor_parallel_size)

Called twice with the same inputs: by the engine right after it reads the model's config, so that a backend
that cannot run the model is refused before the GGUF parse, the tokenizer, worker processes and the weights;
then by each ModelRunner, which builds its layers with the result. In the engine's process the runner's
call returns the engine's selection (``select_attn_backend`` caches per input); a tensor-parallel worker
repeats it on its own device with the same record (rank 0's head counts).
"""

from __future__ import annotations

from attnserve.attention.selector import AttentionSelection, AttentionSelectorConfig, select_attn_backend
from attnserve.config.engine import EngineConfig
from attnserve.config.engine_args import log_unused_options_once
from attnserve.distributed.sharding import shard_heads
from attnserve.model_executor.loader import resolve_dtype
from attnserve.models.registry import get_model_class
from attnserve.platforms import detect_platform


def attention_selector_config(config: EngineConfig, hf_config, device_type: str,
                              tensor_parallel_size: int) -> AttentionSelectorConfig:
    """What a backend must support to run the model: its head size and sliding window (the model class's
    ``dims``), the dtype ``resolve_dtype`` gives on ``device_type``, the KV-cache dtype and block size; under
    tensor parallelism rank 0's head counts (rank 0 has the most: uneven splits give the first ranks one
    more), so that every rank judges the same record and picks the same backend.

    Raises ValueError for an unsupported architecture, for one not built for tensor parallelism when
    ``tensor_parallel_size`` > 1, and for heads the ranks cannot split.
    """
    tp = tensor_parallel_size
    dims = get_model_class(hf_config, tp).dims(hf_config)
    head0 = shard_heads(dims.num_heads, dims.num_kv_heads, tp, 0)
    return AttentionSelectorConfig(
        head_size=dims.head_size,
        dtype=resolve_dtype(config.model.dtype, hf_config, device_type),
        kv_cache_dtype=config.cache.kv_cache_dtype,
        block_size=config.cache.block_size,
        sliding_window=dims.sliding_window,
        num_heads=head0.num_heads if tp > 1 else None,
        num_kv_heads=head0.num_kv_heads if tp > 1 else None,
    )


def select_model_attention(config: EngineConfig, hf_config,
                           tensor_parallel_size: int) -> tuple[AttentionSelectorConfig, AttentionSelection]:
    """The selector config of :func:`attention_selector_config` on ``config.device``'s platform, and the
    backend ``select_attn_backend`` chooses for it with ``config.attention``.

    Raises NoUsableBackendError (a ValueError) with every reason, or :func:`attention_selector_config`'s errors.
    """
    platform = detect_platform(config.device)
    selector_config = attention_selector_config(config, hf_config, platform.device_type, tensor_parallel_size)
    selection = select_attn_backend(config.attention, selector_config, platform)
    if config.attention.backend is None:  # an explicit backend's unused options were logged with the config
        unused = config.attention.unused_options(selection.name)
        if unused:
            log_unused_options_once(selection.name, tuple(unused))
    return selector_config, selection
