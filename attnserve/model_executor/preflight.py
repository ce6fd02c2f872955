"""What loading would refuse, judged before anything loads: from the engine config and the model's config alone.

    preflight(engine_config)   # raises the engine's own error, keyed to its setting, or returns

``attnserve serve`` calls it before it listens (once it has bound its port), so that a setting the model refuses is
one line and exit status 2, as in ``generate``, not a server that listens, answers 503 and then exits 1 with "the
model failed to load". Every check is the call the engine itself makes while loading, with the same inputs, so the
two cannot disagree; what depends on the loaded weights (the KV-cache budget under ``gpu_memory_utilization``: the
GPU's free memory once the weights are there) is left to the load.
"""

from __future__ import annotations

import torch

from attnserve.config.engine import EngineConfig
from attnserve.distributed.sharding import check_gpu_count, check_tensor_parallel_size, shard_heads
from attnserve.model_executor.attention_selection import select_model_attention
from attnserve.model_executor.kv_cache import (
    bytes_per_block,
    check_kv_cache_holds_max_model_len,
    kv_cache_size_key,
    kv_cache_torch_dtype,
    num_kv_blocks,
)
from attnserve.model_executor.loader import complete_hf_config, max_model_len_of, read_hf_config, resolve_model
from attnserve.models.registry import get_model_class
from attnserve.platforms import check_runnable_device, detect_platform, runtime_device


def preflight(config: EngineConfig) -> None:
    """Raise, before the tokenizer, the weights or any worker load, what ``LLMEngine(config)`` would raise for a
    setting the model or the device refuses: a device the engine cannot run on, a tensor_parallel_size the
    model's heads cannot split or (spawned workers) this host's GPUs cannot take, an attention backend (chosen or
    automatic) that cannot run the model, a max_model_len beyond the model's ``max_position_embeddings``, a
    KV-cache budget that holds no block, or (``serve``'s engine refuses it: ``refuse_short_kv_cache``) fewer tokens
    than max_model_len.

    The errors are the engine's (ValueErrors; a ConfigError carries the engine argument as ``key``). Reads the
    model's config (a hub model must already be downloaded: ``loader.fetch_model``); a GGUF's tensors are parsed
    only when max_model_len is set (the parse the engine then reuses in this process)."""
    check_runnable_device(config.device)
    source = resolve_model(config.model)
    hf_config = read_hf_config(source)
    tp = config.parallel.tensor_parallel_size
    check_tensor_parallel_size(hf_config, tp)
    if tp > 1 and config.parallel.distributed_executor_backend != "ray":
        check_gpu_count(config.device, tp)
    selector_config = select_model_attention(config, hf_config, tp).groups[0].selector_config
    if config.model.max_model_len is not None:
        complete_hf_config(hf_config, source)  # a GPT-2 GGUF's context length is known only from its tensors
        max_model_len_of(config.model, hf_config)
    blocks = check_kv_cache_budget(config, hf_config, selector_config.dtype)
    if blocks is not None:
        if config.model.max_model_len is None:
            complete_hf_config(hf_config, source)
        device = torch.device(detect_platform(config.device).device_type)
        check_kv_cache_holds_max_model_len(
            max_model_len_of(config.model, hf_config),
            blocks,
            config.cache.block_size,
            kv_cache_size_key(config.cache, device),
        )


def check_kv_cache_budget(config: EngineConfig, hf_config, dtype: torch.dtype) -> int | None:
    """Raise ``num_kv_blocks``' ConfigError (keyed to the KV-cache setting) when the budget holds no block of
    rank 0's KV cache (rank 0's block is the largest under tensor parallelism: uneven head splits give the first
    ranks one more); return the number of blocks. ``dtype`` is the model's (``resolve_dtype``'s). Skipped (None)
    when ``gpu_memory_utilization`` sizes the cache: that budget is the GPU's memory left once the weights are loaded."""
    if (
        kv_cache_size_key(config.cache, torch.device(detect_platform(config.device).device_type))
        == "gpu_memory_utilization"
    ):
        return None
    block_bytes = kv_block_bytes(config, hf_config, dtype)
    # the device as the engine's runner holds it (cuda:1 for --device cuda:1): its free memory, its name in the line;
    # reserve_bytes: gpu_memory_utilization's only
    return num_kv_blocks(config.cache, runtime_device(config.device), block_bytes, reserve_bytes=0)


def kv_block_bytes(config: EngineConfig, hf_config, dtype: torch.dtype) -> int:
    """The bytes of one block of rank 0's KV cache (all layers, K and V; rank 0's is the largest under tensor
    parallelism) for the model of ``hf_config`` in the model dtype ``dtype``. Raises the model registry's and
    ``shard_heads``' ValueErrors (an architecture not supported, heads the ranks cannot split)."""
    tp = config.parallel.tensor_parallel_size
    dims = get_model_class(hf_config, tp).dims(hf_config)
    kv_heads = shard_heads(dims.num_heads, dims.num_kv_heads, tp, 0).num_kv_heads
    kv_dtype = kv_cache_torch_dtype(config.cache.kv_cache_dtype, dtype)
    return sum(
        bytes_per_block(1, config.cache.block_size, kv_heads, layer.head_size, kv_dtype)
        for layer in dims.layer_attention()
    )
