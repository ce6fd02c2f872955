"""Sizing and allocating the paged KV cache: one tensor per layer in the backend's shape."""

from __future__ import annotations

import functools
import logging
import math
import os

import numpy as np
import torch

from attnserve.attention.kv_cache_dtype import kv_cache_torch_dtype  # noqa: F401 - re-exported: the runner's import
from attnserve.config.cache import CacheConfig
from attnserve.config.fields import ConfigError
from attnserve.refusals.capacity import (
    budget_holds_no_block,
    kv_cache_beyond_memory,
    kv_cache_shorter_than_max_model_len,
)

logger = logging.getLogger(__name__)

CPU_DEFAULT_KV_CACHE_BYTES = 2 << 30  # 2 GiB


def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_size: int, dtype: torch.dtype) -> int:
    """K and V of one block in every layer, in bytes."""
    return 2 * num_layers * block_size * num_kv_heads * head_size * torch.empty((), dtype=dtype).element_size()


def kv_cache_size_key(cache: CacheConfig, device: torch.device) -> str:
    """The engine argument that sizes the KV cache on ``device``, in :func:`num_kv_blocks`' order:
    ``num_gpu_blocks`` when set, else ``kv_cache_memory`` (set, or its 2 GiB default on CPU), else
    ``gpu_memory_utilization``. Errors about the cache's size carry it, for the CLI to name its flag."""
    if cache.num_gpu_blocks is not None:
        return "num_gpu_blocks"
    if cache.kv_cache_memory is not None or device.type == "cpu":
        return "kv_cache_memory"
    return "gpu_memory_utilization"


def available_bytes(device: torch.device, reserve_bytes: int = 0) -> int | None:
    """Bytes a new allocation on ``device`` can take now, less ``reserve_bytes``: on a GPU what is free (other
    processes' memory counted) plus what torch's allocator holds unused; on CPU the kernel's MemAvailable
    (``/proc/meminfo``: free memory plus what it can reclaim). None where it cannot be read (a CPU without
    ``/proc``, another device type)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device) - reserve_bytes
    if device.type == "cpu" and os.path.exists("/proc/meminfo"):
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 - reserve_bytes
    return None


def check_kv_cache_fits(blocks: int, block_bytes: int, key: str, device: torch.device, reserve_bytes: int) -> None:
    """Raise ConfigError, keyed ``key``, when ``blocks`` blocks of ``block_bytes`` are more than
    :func:`available_bytes` of ``device``: a cache asked for by block count or bytes (``num_gpu_blocks``,
    ``kv_cache_memory``) is then one line saying how many blocks fit, not an allocator's traceback or the
    operating system's out-of-memory kill."""
    available = available_bytes(device, reserve_bytes)
    if available is None or blocks * block_bytes <= available:
        return
    raise ConfigError(kv_cache_beyond_memory(blocks, block_bytes, available, device, key))


def _blocks_in(budget: int, block_bytes: int, key: str) -> int:
    """``budget`` bytes in whole blocks; ConfigError keyed ``key`` when that is none."""
    blocks = budget // block_bytes
    if blocks < 1:
        raise ConfigError(budget_holds_no_block(budget, block_bytes, key))
    return int(blocks)


def planned_kv_blocks(cache: CacheConfig, device_type: str, block_bytes: int) -> int | None:
    """How many blocks the settings alone give, without looking at a device: ``num_gpu_blocks`` if set; else
    ``kv_cache_memory`` bytes (2 GiB on CPU when unset) in blocks of ``block_bytes``; None when
    ``gpu_memory_utilization`` sizes the cache (the GPU's free memory decides). ``device_type``: "cpu" or "cuda".

    Raises ConfigError, keyed by :func:`kv_cache_size_key`, when that budget holds no block. ``attnserve config``
    calls it to plan a cache; :func:`num_kv_blocks` starts from it."""
    if cache.num_gpu_blocks is not None:
        return cache.num_gpu_blocks
    if cache.kv_cache_memory is None and device_type != "cpu":
        return None
    key = kv_cache_size_key(cache, torch.device(device_type))
    return _blocks_in(cache.kv_cache_memory or CPU_DEFAULT_KV_CACHE_BYTES, block_bytes, key)


@functools.cache
def _warn_gpu_memory_utilization_on_cpu(value: float) -> None:
    logger.warning(
        "gpu_memory_utilization %s has no effect on CPU: kv_cache_memory sizes the KV cache there (default 2 GiB)",
        value,
    )


def num_kv_blocks(cache: CacheConfig, device: torch.device, block_bytes: int, reserve_bytes: int) -> int:
    """How many blocks fit: ``num_gpu_blocks`` if set; else ``kv_cache_memory`` bytes; else 2 GiB on CPU or
    ``gpu_memory_utilization`` of the GPU minus what is allocated now and ``reserve_bytes`` for activations,
    at most what is free on the GPU now (other processes' memory included) minus ``reserve_bytes``.

    Raises ConfigError, keyed by :func:`kv_cache_size_key`, when the budget holds no block, or when a cache
    sized by ``num_gpu_blocks`` or ``kv_cache_memory`` (or the CPU default) is more than the device's memory
    available now (:func:`check_kv_cache_fits`)."""
    if device.type == "cpu" and cache.gpu_memory_utilization != CacheConfig().gpu_memory_utilization:
        _warn_gpu_memory_utilization_on_cpu(cache.gpu_memory_utilization)
    blocks = planned_kv_blocks(cache, device.type, block_bytes)
    if blocks is not None:  # gpu_memory_utilization's budget is bounded by what is free below
        check_kv_cache_fits(blocks, block_bytes, kv_cache_size_key(cache, device), device, reserve_bytes)
        return blocks
    total = torch.cuda.get_device_properties(device).total_memory
    allocated = torch.cuda.memory_allocated(device)
    budget = int(total * cache.gpu_memory_utilization) - allocated - reserve_bytes
    # other processes on this GPU (the engine's process beside tensor-parallel rank 0, another engine)
    # and memory outside torch's allocator (CUDA context, NCCL) count too: never plan past what is free
    available = available_bytes(device, reserve_bytes)
    if available < budget:
        free, _ = torch.cuda.mem_get_info(device)
        logger.warning(
            "KV cache: %.2f GiB of %s is in use outside this process's tensors; the cache gets "
            "%.2f GiB instead of the %.2f GiB gpu_memory_utilization %.2f allows",
            (total - free - torch.cuda.memory_reserved(device)) / 2**30,
            device,
            available / 2**30,
            budget / 2**30,
            cache.gpu_memory_utilization,
        )
        budget = available
    return _blocks_in(budget, block_bytes, "gpu_memory_utilization")


def check_kv_cache_holds_max_model_len(max_model_len: int, num_blocks: int, block_size: int, key: str) -> None:
    """Raise ConfigError, keyed ``key`` (:func:`kv_cache_size_key`'s), when ``num_blocks`` blocks of ``block_size``
    tokens hold fewer tokens than ``max_model_len``: the server then refuses to start, as vLLM does ("To serve at
    least one request with the model's max seq len ..."), instead of ending requests early while it reports
    max_model_len. The message gives the largest max_model_len that fits."""
    if num_blocks * block_size < max_model_len:
        raise ConfigError(kv_cache_shorter_than_max_model_len(max_model_len, num_blocks, block_size, key))


def allocate_kv_caches(
    backend,
    layout,
    num_layers: int,
    num_blocks: int,
    block_size: int,
    num_kv_heads: int,
    head_size: int,
    dtype: torch.dtype,
    device: torch.device,
) -> list[torch.Tensor]:
    """One zeroed tensor per layer with the backend's logical shape, its memory in ``layout`` (NHD/HND) order."""
    shape = backend.get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size)
    order = backend.get_kv_cache_stride_order(layout)
    physical = tuple(shape[i] for i in order)
    inverse = [order.index(i) for i in range(len(order))]
    zeros = _zeros_on_first_touch if device.type == "cpu" else functools.partial(torch.zeros, device=device)
    return [zeros(physical, dtype=dtype).permute(*inverse) for _ in range(num_layers)]


def _zeros_on_first_touch(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zeroed CPU tensor whose pages the OS zeroes when first written (numpy's calloc), not all at allocation:
    ``torch.zeros`` wrote the whole CPU cache (2 GiB by default) at every start, while a short run touches a few
    MiB of it. 64-byte aligned, as PyTorch's allocator."""
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.zeros(nbytes + 64, dtype=np.uint8)
    start = -raw.ctypes.data % 64
    return torch.from_numpy(raw[start : start + nbytes]).view(dtype).view(shape)
