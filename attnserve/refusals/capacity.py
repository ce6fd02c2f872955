"""The words of a model or prompt that does not fit what the engine was given: a prompt longer than the KV cache
or a step's token budget, a KV cache beyond the device's memory or shorter than max_model_len, heads that a
tensor-parallel size cannot split.

``engine/scheduler.py``, ``model_executor/kv_cache.py`` and ``distributed/sharding.py`` refuse with these; each is
keyed to the setting to change, for the command line to name its flag.
"""

from __future__ import annotations

from attnserve.refusals import Refusal

# ---------------------------------------------------------------- the scheduler (engine/scheduler.py)


def prompt_exceeds_kv_cache(
    num_tokens: int, blocks_needed: int, num_blocks: int, block_size: int, kv_cache_key: str | None
) -> Refusal:
    """A prompt the whole KV cache cannot hold (with the one token it generates), keyed to the cache's size setting
    (``kv_cache_key``: ``num_gpu_blocks``, ``kv_cache_memory``; None: no setting sized it)."""
    capacity = num_blocks * block_size
    return Refusal(
        reason=f"prompt of {num_tokens} tokens needs {blocks_needed} KV blocks ({num_tokens + 1} tokens with the "
        f"one it generates), the KV cache has {num_blocks} ({capacity} tokens), so at most {capacity - 1} prompt "
        "tokens fit",
        advice=f"raise {{{kv_cache_key}}}" if kv_cache_key else "give the KV cache more memory",
        key=kv_cache_key,
    )


def prompt_exceeds_step(num_tokens: int, max_num_batched_tokens: int) -> Refusal:
    """A prompt longer than one step's token budget, with chunked prefill off."""
    return Refusal(
        reason=f"prompt of {num_tokens} tokens exceeds max_num_batched_tokens {max_num_batched_tokens}, and "
        "enable_chunked_prefill is false: a prompt must fit one step",
        key="max_num_batched_tokens",
    )


# ---------------------------------------------------------------- KV cache and ranks (model_executor/kv_cache.py, distributed/)


def kv_cache_beyond_memory(blocks: int, block_bytes: int, available: int, device: object, key: str) -> Refusal:
    """A KV cache asked for by block count or bytes (``key``) that the device's free memory cannot hold."""
    fit = max(0, available) // block_bytes
    return Refusal(
        reason=f"a KV cache of {blocks} blocks ({blocks * block_bytes / 2**30:.2f} GiB) does not fit in the "
        f"{max(0, available) / 2**30:.2f} GiB of {device} memory available now "
        f"({fit} block{' fits' if fit == 1 else 's fit'})",
        advice=f"lower {{{key}}}",
        key=key,
    )


def budget_holds_no_block(budget: int, block_bytes: int, key: str) -> Refusal:
    return Refusal(
        reason=f"KV-cache budget of {budget} bytes holds no block of {block_bytes} bytes",
        advice=f"raise {{{key}}} or set {{num_gpu_blocks}}",
        key=key,
    )


def kv_cache_shorter_than_max_model_len(max_model_len: int, num_blocks: int, block_size: int, key: str) -> Refusal:
    """A KV cache that cannot hold one request of ``max_model_len`` tokens (vLLM refuses to start too)."""
    capacity = num_blocks * block_size
    blocks = f"{num_blocks} block{'s' if num_blocks != 1 else ''} of {block_size}"
    return Refusal(
        reason=f"the KV cache holds {capacity} tokens ({blocks}), fewer than max_model_len {max_model_len}, so not "
        "one request of max_model_len tokens fits",
        advice=f"lower {{max_model_len}} to at most {capacity} or raise {{{key}}}",
        key=key,
    )


def heads_not_grouped(num_heads: int, num_kv_heads: int) -> Refusal:
    """A model whose query heads are no multiple of its KV heads (no tensor-parallel size splits them)."""
    return Refusal(reason=f"{num_heads} query heads are not a multiple of {num_kv_heads} KV heads")


def heads_cannot_split(size: int, num_heads: int, num_kv_heads: int, group: int) -> Refusal:
    return Refusal(
        ("tensor_parallel_size",),
        size,
        reason=f"cannot split {num_heads} query heads over {num_kv_heads} KV heads: with fewer KV heads than ranks "
        f"the ranks must be a multiple of the KV heads and divide each KV head's {group} query heads",
    )


def sizes_for_this_model(sizes: list[int]) -> str:
    """The tensor-parallel sizes a model's heads split over: ``1, 2, 4 for this model``."""
    return f"{', '.join(map(str, sizes))} for this model"
