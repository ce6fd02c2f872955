"""Tensor parallelism on CPU (gloo): TP=2 gives exactly TP=1's greedy tokens, with spawned processes and with
Ray actors; a worker that dies fails the step with a clear error instead of hanging."""

from __future__ import annotations

import os
import signal
import time

import pytest

from attnserve import LLM, SamplingParams
from attnserve.executor.base import WorkerDiedError

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], list(range(100, 137)), [42]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
ENGINE = dict(dtype="float32", device="cpu", block_size=4, kv_cache_memory=8 << 20)


def tokens(llm: LLM, prompts=PROMPTS, params=GREEDY) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


@pytest.fixture(scope="module")
def qwen3_dir(tiny_model_dir):
    return tiny_model_dir("qwen3")  # 4 query heads, 2 KV heads, head_dim 32, untied LM head


@pytest.fixture(scope="module")
def qwen3_tp1_tokens(qwen3_dir):
    return tokens(LLM(qwen3_dir, **ENGINE))


@pytest.fixture
def tp2():
    """Build TP=2 engines; shut their workers down after the test."""
    made = []

    def build(model, **kwargs) -> LLM:
        llm = LLM(model, tensor_parallel_size=2, **{**ENGINE, **kwargs})
        made.append(llm)
        return llm

    yield build
    for llm in made:
        llm.engine.shutdown()


def test_tp2_mp_matches_tp1_tiny_qwen3(qwen3_dir, qwen3_tp1_tokens, tp2):
    llm = tp2(qwen3_dir)
    assert llm.engine.runner is None and llm.engine.info.tensor_parallel_size == 2
    assert llm.engine.info.num_kv_heads == 1  # each rank caches one of the 2 KV heads
    assert tokens(llm) == qwen3_tp1_tokens


def test_tp2_mp_matches_tp1_default_model(default_llm, tp2):
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    prompts = ["The capital of France is", "def fibonacci(n):"]
    expected = tokens(default_llm, prompts, params)
    # 9 query / 3 KV heads: rank 0 gets 2 KV heads (6 query), rank 1 one (3 query)
    llm = tp2(None, attention_backend="CPU_ATTN", kv_cache_memory=32 << 20)
    assert tokens(llm, prompts, params) == expected


def test_tp2_ray_matches_tp1_tiny_qwen3(qwen3_dir, qwen3_tp1_tokens, tp2):
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False)
    try:
        llm = tp2(qwen3_dir, distributed_executor_backend="ray")
        assert tokens(llm) == qwen3_tp1_tokens
        llm.engine.shutdown()
    finally:
        ray.shutdown()


def test_dead_worker_fails_pending_requests_quickly(qwen3_dir, tp2):
    llm = tp2(qwen3_dir)
    engine = llm.engine
    engine.add_request(PROMPTS[1], SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True))
    engine.step()
    pid = engine.executor.pids[1]
    os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(WorkerDiedError) as e:
        while engine.has_unfinished_requests():
            engine.step()
    assert time.monotonic() - t0 < 10
    assert str(e.value) == f"worker rank 1 (pid {pid}) died (exit code -9); pending requests failed"
    assert isinstance(e.value, RuntimeError) and not engine.has_unfinished_requests()
    with pytest.raises(RuntimeError, match="worker rank 1 .* died"):  # later calls fail the same way
        llm.generate(PROMPTS[0], GREEDY)
    assert not engine.has_unfinished_requests()


def test_bench_latency_compares_tp_sizes_in_one_run(qwen3_dir, tmp_path):
    import json

    from attnserve.entrypoints.cli.main import main

    out = tmp_path / "lat.json"
    rc = main(["bench", "latency", "--model", qwen3_dir, "--load-format", "dummy", "--batch-size", "1",
               "--input-len", "8", "--output-len", "4", "--num-iters", "1", "--num-iters-warmup", "0",
               "--device", "cpu", "--dtype", "float32", "--kv-cache-memory", str(8 << 20),
               "--compare-tensor-parallel-sizes", "1", "2", "--output-json", str(out), "--no-progress"])
    assert rc == 0
    data = json.loads(out.read_text())
    assert [(r["name"], r["batch_size"]) for r in data["results"]] == [("attnserve tp1", 1), ("attnserve tp2", 1)]
    assert all(r["tpot_s"]["p50"] > 0 for r in data["results"])


def _proc_environ(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as f:
        return dict(i.decode().split("=", 1) for i in f.read().split(b"\0") if b"=" in i)


@pytest.mark.skipif(not os.path.exists("/proc/self/environ"), reason="reads /proc/PID/environ")
def test_workers_start_with_nccl_env_and_exit_cleanly(qwen3_dir, tp2, monkeypatch):
    from attnserve.executor.env import WORKER_ENV_DEFAULTS

    monkeypatch.delenv("NCCL_NVLS_ENABLE", raising=False)
    monkeypatch.setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "7")  # the user's value wins
    llm = tp2(qwen3_dir)
    procs = llm.engine.executor.procs
    for p in procs:  # in the environment the process started with, not only set later in Python
        env = _proc_environ(p.pid)
        assert env["NCCL_NVLS_ENABLE"] == WORKER_ENV_DEFAULTS["NCCL_NVLS_ENABLE"] == "0"
        assert env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "7"
        assert env["NVSHMEM_DISABLE_NVLS"] == "1"
    assert "NCCL_NVLS_ENABLE" not in os.environ  # set for the spawn only
    assert len(tokens(llm, PROMPTS[:1])[0]) == GREEDY.max_tokens
    llm.engine.shutdown()
    assert [p.exitcode for p in procs] == [0, 0]  # asked to stop: the process group destroyed, a clean exit


def test_more_ranks_than_gpus_is_refused_before_any_worker_starts(monkeypatch):
    import torch

    import attnserve.platforms as platforms
    from attnserve.executor.multiproc import check_gpu_count
    from attnserve.platforms.interface import Platform

    monkeypatch.setattr(platforms, "detect_platform", lambda device: Platform("cuda", "test GPU", (9, 0)))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    with pytest.raises(ValueError, match=r"tensor_parallel_size 2 needs 2 GPUs \(one per rank\); this host shows 1 "
                                         r"\(CUDA_VISIBLE_DEVICES=3\)"):
        check_gpu_count("cuda", 2)
    check_gpu_count("cuda", 1)
