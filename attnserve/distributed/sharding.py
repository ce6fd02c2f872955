"""How a dimension splits over tensor-parallel ranks: plain integer arithmetic, testable without processes.

Splits need not be even: ``shard_range`` gives the first ``total % size`` ranks one more item, so e.g. the
default model's 3 KV heads (9 query heads) run on 2 ranks as 2 + 1 KV heads (6 + 3 query heads).
Also the refusals of a size that cannot run, judged before any worker starts: heads that do not split
(``check_tensor_parallel_size``), more ranks than GPUs (``check_gpu_count``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from attnserve.config.fields import ConfigError
from attnserve.refusals import Refused
from attnserve.refusals.devices import too_few_gpus
from attnserve.refusals.capacity import heads_cannot_split, heads_not_grouped, sizes_for_this_model


def shard_range(total: int, size: int, rank: int) -> tuple[int, int]:
    """``(start, length)`` of ``rank``'s part of ``total`` items split as evenly as possible."""
    base, extra = divmod(total, size)
    return rank * base + min(rank, extra), base + (1 if rank < extra else 0)


@dataclass(frozen=True)
class HeadShard:
    """The attention heads one rank computes: query heads ``[q_start, q_start + num_heads)`` and KV heads
    ``[kv_start, kv_start + num_kv_heads)`` of the checkpoint (each query head's KV head is on the same rank)."""

    q_start: int
    num_heads: int
    kv_start: int
    num_kv_heads: int


def shard_heads(num_heads: int, num_kv_heads: int, size: int, rank: int) -> HeadShard:
    """Split attention heads by KV group; with fewer KV heads than ranks each KV head is replicated.

    Raises ValueError naming the head counts when they cannot be split over ``size`` ranks.
    """
    if num_heads % num_kv_heads:
        raise Refused(heads_not_grouped(num_heads, num_kv_heads))
    group = num_heads // num_kv_heads
    if num_kv_heads >= size:
        kv_start, n_kv = shard_range(num_kv_heads, size, rank)
        return HeadShard(kv_start * group, n_kv * group, kv_start, n_kv)
    # fewer KV heads than ranks: KV head j lives on `replicas` ranks, which split its query heads
    replicas = size // num_kv_heads
    if size % num_kv_heads or group % replicas:
        raise Refused(heads_cannot_split(size, num_heads, num_kv_heads, group))
    per = num_heads // size
    return HeadShard(rank * per, per, rank // replicas, 1)


@dataclass(frozen=True)
class VocabShard:
    """Rows ``[start, end)`` of the vocabulary on one rank, stored padded to ``rows`` (same on every rank,
    so that gathered logits line up: rank r's rows sit at ``[r * rows, (r + 1) * rows)``)."""

    start: int
    end: int
    rows: int


def shard_vocab(vocab_size: int, size: int, rank: int) -> VocabShard:
    rows = -(-vocab_size // size)
    start = min(rank * rows, vocab_size)
    return VocabShard(start, min(start + rows, vocab_size), rows)


def tensor_parallel_sizes_for(num_heads: int, num_kv_heads: int) -> list[int]:
    """Every tensor_parallel_size (1 .. num_heads) that can split these attention heads."""
    ok = []
    for size in range(1, num_heads + 1):
        try:
            shard_heads(num_heads, num_kv_heads, size, 0)
        except ValueError:
            continue
        ok.append(size)
    return ok


def check_tensor_parallel_size(hf_config, size: int) -> None:
    """Raise ConfigError (a ValueError keyed ``tensor_parallel_size``, naming the head counts and the sizes that
    work) when a model with this Hugging Face config cannot run on ``size`` ranks; read from the config, before
    any worker starts. Heads that no size can split are the model's fault: no key then."""
    num_heads = hf_config.num_attention_heads
    num_kv_heads = getattr(hf_config, "num_key_value_heads", None) or num_heads
    try:
        shard_heads(num_heads, num_kv_heads, size, 0)
    except Refused as e:
        sizes = tensor_parallel_sizes_for(num_heads, num_kv_heads)
        # heads no size splits are the model's fault: that refusal names no setting (and no size is allowed)
        allowed = sizes_for_this_model(sizes) if e.refusal.path else None
        raise ConfigError(dataclasses.replace(e.refusal, allowed=allowed)) from None


def check_gpu_count(device: str, n: int) -> None:
    """On a GPU platform, refuse (ConfigError, a ValueError keyed ``tensor_parallel_size``) a tensor_parallel_size
    larger than the GPUs this host shows, before any worker starts."""
    from attnserve.platforms import detect_platform

    if detect_platform(device).device_type == "cpu":
        return
    import torch

    count = torch.cuda.device_count()
    if n > count:
        import os

        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        raise ConfigError(too_few_gpus(n, count, visible))
