"""Model loading for the engine: the model's config, tokenizer and context length, and the executor that holds
its weights.

    loaded = load_model(config)   # -> LoadedModel(hf_config, tokenizer, max_model_len, executor)

What the config alone can refuse is refused first, in seconds: a device this machine cannot run, heads the ranks
cannot split, the architecture, the attention backend (``select_model_attention``, the call every ModelRunner
makes). Only then come the GGUF parse, the tokenizer, the worker processes and the weights.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass, field, fields
from typing import Any

from attnserve.config.engine import EngineConfig
from attnserve.core.sampling_params import SamplingParams
from attnserve.distributed.sharding import check_tensor_parallel_size
from attnserve.executor.base import Executor, WorkerDiedError, make_executor
from attnserve.layers.linear import CheckpointShapeError
from attnserve.model_executor import gguf_cache
from attnserve.model_executor.attention_selection import select_model_attention
from attnserve.model_executor.generation_config import generation_defaults
from attnserve.model_executor.loader import (
    ModelSource,
    complete_hf_config,
    load_model_tokenizer,
    max_model_len_of,
    read_hf_config,
    resolve_model,
)
from attnserve.platforms import check_runnable_device

logger = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    """What the engine runs: the model's transformers config, its tokenizer, the longest sequence it takes and the
    executor holding its weights (its KV-cache size is ``executor.info``)."""

    hf_config: Any
    tokenizer: Any
    max_model_len: int
    executor: Executor
    # default sampling values from the generation config (--generation-config), SamplingParams field -> value
    generation_defaults: dict[str, Any] = field(default_factory=dict)


def load_model(config: EngineConfig) -> LoadedModel:
    """Load ``config``'s model and start its executor. A GGUF's config read from the cache (gguf_cache.py) that does
    not fit its weights (stale, damaged): drop that cache entry and convert the GGUF again, once."""
    check_runnable_device(config.device)  # cuda:9.0 is valid config for planning, not for running
    source = resolve_model(config.model)
    cached = gguf_cache.cached_entry(source.path, gguf_cache.cache_root()) if source.is_gguf else None
    try:
        return _load(config, source)
    except (CheckpointShapeError, WorkerDiedError) as e:
        if cached is None or not (isinstance(e, CheckpointShapeError) or e.checkpoint_shape):
            raise
        logger.warning(
            "the GGUF config cached in %s does not fit the weights (%s); deleting that cache entry "
            "and converting %s again",
            cached,
            e.summary if isinstance(e, WorkerDiedError) else e,
            source.path,
        )
        shutil.rmtree(cached, ignore_errors=True)
        return _load(config, source)


def _compile_ahead(config: EngineConfig, hf_config, attention) -> None:
    """The attention kernels the model will need, compiled in the background (FLASHINFER's JIT modules)."""
    from attnserve.model_executor.compile_ahead import compile_attention_kernels_ahead
    from attnserve.models.registry import get_model_class
    from attnserve.platforms import runtime_device

    try:
        dims = get_model_class(hf_config, 1).dims(hf_config)
        device = runtime_device(config.device)
    except ValueError:  # refused later, where the load refuses it
        return
    compile_attention_kernels_ahead(config, attention, dims.num_heads, dims.num_kv_heads, device)


def _load(config: EngineConfig, source: ModelSource) -> LoadedModel:
    """One attempt: the checks the config alone answers, then the tokenizer and the executor (the weights)."""
    hf_config = read_hf_config(source)
    defaults = generation_defaults(
        config.model, None if source.is_gguf else source.path, frozenset(f.name for f in fields(SamplingParams))
    )
    tp = config.parallel.tensor_parallel_size
    check_tensor_parallel_size(hf_config, tp)
    attention = select_model_attention(config, hf_config, tp)
    if tp == 1:  # the runner is in this process: its JIT kernels compile while the tokenizer and weights load
        _compile_ahead(config, hf_config, attention)
    complete_hf_config(hf_config, source)
    tokenizer = load_model_tokenizer(config.model, source, hf_config)
    max_model_len = max_model_len_of(config.model, hf_config)
    return LoadedModel(hf_config, tokenizer, max_model_len, make_executor(config, hf_config, source), defaults)
