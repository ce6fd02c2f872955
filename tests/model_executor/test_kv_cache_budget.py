"""KV-cache sizing on a GPU (torch.cuda's memory queries faked): gpu_memory_utilization of the device, but
never more than is free, so that a second process on the GPU (the engine's process beside tensor-parallel
rank 0) shrinks the cache instead of running it out of memory."""

from __future__ import annotations

import types

import pytest
import torch

from attnserve.config.cache import CacheConfig
from attnserve.model_executor.kv_cache import num_kv_blocks

GiB = 1 << 30


def fake_gpu(monkeypatch, total: int, free: int, allocated: int, reserved: int) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: types.SimpleNamespace(total_memory=total))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d: (free, total))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d: allocated)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d: reserved)


def test_gpu_budget_is_utilization_minus_allocated_and_reserve(monkeypatch):
    fake_gpu(monkeypatch, total=100 * GiB, free=80 * GiB, allocated=10 * GiB, reserved=12 * GiB)
    # 0.5 * 100 - 10 - 5 = 35 GiB; free 80 + 2 cached - 5 = 77: the utilization decides
    assert num_kv_blocks(CacheConfig(gpu_memory_utilization=0.5), torch.device("cuda", 0), GiB, 5 * GiB) == 35


def test_gpu_budget_never_exceeds_free_memory(monkeypatch, caplog):
    # another process holds 60 GiB of this 100 GiB GPU: 0.9 would plan 75 GiB, only 30 - 5 + 2 = 27 are there
    fake_gpu(monkeypatch, total=100 * GiB, free=28 * GiB, allocated=10 * GiB, reserved=12 * GiB)
    with caplog.at_level("WARNING"):
        assert num_kv_blocks(CacheConfig(), torch.device("cuda", 0), GiB, 5 * GiB) == 25
    assert "60.00 GiB of cuda:0 is in use outside this process's tensors" in caplog.text


def test_gpu_budget_with_nothing_free_says_what_to_do(monkeypatch):
    fake_gpu(monkeypatch, total=100 * GiB, free=1 * GiB, allocated=0, reserved=0)
    with pytest.raises(ValueError, match="holds no block") as e:
        num_kv_blocks(CacheConfig(), torch.device("cuda", 0), GiB, 5 * GiB)
    assert e.value.key == "gpu_memory_utilization" and "raise gpu_memory_utilization or set num_gpu_blocks" in str(
        e.value
    )


def test_explicit_kv_cache_memory_is_taken_as_given(monkeypatch):
    fake_gpu(monkeypatch, total=100 * GiB, free=80 * GiB, allocated=0, reserved=0)
    assert num_kv_blocks(CacheConfig(kv_cache_memory=4 * GiB), torch.device("cuda", 0), GiB, 0) == 4


@pytest.mark.parametrize(
    "cache,key",
    [(CacheConfig(kv_cache_memory=4 * GiB), "kv_cache_memory"), (CacheConfig(num_gpu_blocks=4), "num_gpu_blocks")],
)
def test_an_explicit_cache_beyond_free_memory_is_one_error(monkeypatch, cache, key):
    """Not the allocator's out-of-memory traceback later: the cache's size, what is free, what fits."""
    fake_gpu(monkeypatch, total=100 * GiB, free=1 * GiB + 5, allocated=0, reserved=0)
    with pytest.raises(ValueError) as e:
        num_kv_blocks(cache, torch.device("cuda", 0), GiB, 5)
    assert (str(e.value), e.value.key) == (
        "a KV cache of 4 blocks (4.00 GiB) does not fit in the 1.00 GiB of cuda:0 memory available now (1 block fits); "
        f"lower {key}",
        key,
    )


def test_a_cpu_cache_beyond_the_machines_memory_is_one_error():
    """On CPU against the kernel's MemAvailable (a 10^20-block cache: before, torch's overflow or the OOM killer)."""
    with pytest.raises(
        ValueError,
        match=r"^a KV cache of 100000000000000000000 blocks \(\d+\.\d\d GiB\) does not fit "
        r"in the \d+\.\d\d GiB of cpu memory available now \(\d+ blocks? fits?\); "
        r"lower num_gpu_blocks$",
    ) as e:
        num_kv_blocks(CacheConfig(num_gpu_blocks=10**20), torch.device("cpu"), 1024, 0)
    assert e.value.key == "num_gpu_blocks"


@pytest.mark.parametrize(
    "device, cuda, expected",
    [
        ("cpu", True, "cpu"),
        ("auto", False, "cpu"),
        ("cuda", True, "cuda:1"),
        ("auto", True, "cuda:1"),  # the current device: 1 here (faked), 0 unless a process chose
        ("cuda:3", True, "cuda:3"),
        (" CUDA:2 ", True, "cuda:2"),
    ],
)
def test_the_runtime_device_has_its_index(monkeypatch, device, cuda, expected):
    """What the engine runs on, as the KV-cache lines name it: 'cuda:0', never a bare 'cuda'."""
    from attnserve.platforms import runtime_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert str(runtime_device(device)) == expected


@pytest.mark.parametrize("device", ["cuda:9.0", "tpu"])
def test_no_runtime_device_for_a_simulated_gpu(device):
    from attnserve.platforms import runtime_device

    with pytest.raises(ValueError, match="is not a device the engine runs on"):
        runtime_device(device)


def test_serves_kv_cache_line_names_the_gpu_with_its_index(monkeypatch, tiny_model_dir):
    """--device cuda: the line said 'of cuda memory available now'; the GPU is cuda:0."""
    from attnserve.config import build_engine_config
    from attnserve.model_executor import preflight
    from attnserve.model_executor.loader import read_hf_config, resolve_model
    from attnserve.platforms import Platform

    config = build_engine_config(tiny_model_dir("llama"), device="cuda", num_gpu_blocks=4 * GiB // 8192)
    monkeypatch.setattr(preflight, "detect_platform", lambda d: Platform("cuda", "fake", (9, 0)))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    fake_gpu(monkeypatch, total=100 * GiB, free=1 * GiB + 5, allocated=0, reserved=0)
    with pytest.raises(ValueError) as e:  # the tiny Llama's block: 8192 bytes in float32, 4096 in bfloat16
        preflight.check_kv_cache_budget(config, read_hf_config(resolve_model(config.model)), torch.float32)
    assert str(e.value) == (
        "a KV cache of 524288 blocks (4.00 GiB) does not fit in the 1.00 GiB of cuda:0 memory "
        "available now (131072 blocks fit); lower num_gpu_blocks"
    )
