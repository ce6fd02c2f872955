"""Tensor parallelism on CPU (gloo): TP=2 gives exactly TP=1's greedy tokens, with spawned processes and with
Ray actors, with synchronous and async scheduling (rank 0 broadcasts the tokens the other ranks' placeholders
need); a worker that dies fails the step with a clear error instead of hanging; a worker queues the next step
before the last one's tokens are ready and replies in step order."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from attnserve import LLM, SamplingParams
from attnserve.executor.base import WorkerDiedError
from tests.helpers import abort_second_while_in_flight

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


@pytest.fixture(scope="module")
def qwen3_tp2_pair(qwen3_dir):
    """Two TP=2 engines of spawned workers: synchronous and async scheduling; shut down after the module."""
    pair = [LLM(qwen3_dir, tensor_parallel_size=2, async_scheduling=a, **ENGINE) for a in (False, True)]
    yield pair
    for llm in pair:
        llm.engine.shutdown()


def _summary(outs) -> list:
    return [[(c.token_ids, c.text, c.finish_reason, c.stop_reason) for c in o.outputs] for o in outs]


def _assert_logprobs_close(outs, ref_outs) -> None:
    """Same top tokens and ranks; values within float32 rounding: async scheduling can batch a step
    differently (it computes a request's step after a stop, then drops it), which moves the last bits."""
    for o, r in zip(outs, ref_outs):
        for c, rc in zip(o.outputs, r.outputs):
            assert len(c.logprobs) == len(rc.logprobs)
            for step, ref_step in zip(c.logprobs, rc.logprobs):
                assert {t: lp.rank for t, lp in step.items()} == {t: lp.rank for t, lp in ref_step.items()}
                assert all(abs(lp.logprob - ref_step[t].logprob) < 1e-4 for t, lp in step.items())


def _all_blocks_free(llm: LLM) -> bool:
    bm = llm.engine.block_manager
    return bm.num_free_blocks == bm.num_blocks and llm.engine._in_flight is None


def test_tp2_mp_matches_tp1_tiny_qwen3(qwen3_tp2_pair, qwen3_tp1_tokens):
    sync, asynchronous = qwen3_tp2_pair
    assert (sync.engine.async_scheduling, asynchronous.engine.async_scheduling) == (False, True)
    for llm in qwen3_tp2_pair:
        assert llm.engine.runner is None and llm.engine.info.tensor_parallel_size == 2
        assert llm.engine.info.num_kv_heads == 1  # each rank caches one of the 2 KV heads
        assert tokens(llm) == qwen3_tp1_tokens
        assert _all_blocks_free(llm)


def test_tp2_prefix_caching_matches_tp1_without_it(qwen3_tp2_pair, qwen3_dir):
    """Shared prefixes under tensor parallelism: every rank reads the blocks the engine's one block manager
    says are cached; the tokens are TP=1's without caching, sync and async."""
    shared = list(range(200, 241))  # 10 full blocks of 4 and one token
    prompts = [shared + [300 + i, 301 + i] for i in range(3)]
    reference = tokens(LLM(qwen3_dir, enable_prefix_caching=False, **ENGINE), prompts)
    for llm in qwen3_tp2_pair:
        assert llm.engine.block_manager.enable_prefix_caching
        llm.reset_prefix_cache()
        outs = llm.generate(prompts, GREEDY)
        assert [o.outputs[0].token_ids for o in outs] == reference
        assert [o.num_cached_tokens for o in outs] == [0, 40, 40]
        assert _all_blocks_free(llm)


def test_tp2_async_stop_rules_logprobs_and_seeded_sampling_match_sync(qwen3_tp2_pair, qwen3_tp1_tokens):
    sync, asynchronous = qwen3_tp2_pair
    # stop on a token each request generates mid-way (EOS is rare for random weights), at max_tokens, on a string
    params = [
        SamplingParams(temperature=0.0, max_tokens=3 + i, stop_token_ids=[toks[2]], logprobs=2)
        for i, toks in enumerate(qwen3_tp1_tokens)
    ]
    params[2] = SamplingParams(
        temperature=0.0,
        max_tokens=12,
        ignore_eos=True,
        logprobs=1,
        stop=[sync.tokenizer.decode(qwen3_tp1_tokens[2][4:6])],
    )
    s, a = sync.generate(PROMPTS, params), asynchronous.generate(PROMPTS, params)
    assert _summary(a) == _summary(s)
    _assert_logprobs_close(a, s)
    assert [len(o.outputs[0].token_ids) for o in s][:2] == [3, 3]  # stopped by the stop token
    assert s[2].outputs[0].finish_reason == "stop" and len(s[2].outputs[0].token_ids) < 12
    short = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)  # the prefill's token ends it
    assert tokens(asynchronous, PROMPTS, short) == [t[:1] for t in qwen3_tp1_tokens]
    seeded = SamplingParams(temperature=1.0, top_k=20, seed=7, n=2, max_tokens=8, ignore_eos=True)
    assert _summary(asynchronous.generate(PROMPTS, seeded)) == _summary(sync.generate(PROMPTS, seeded))
    assert _all_blocks_free(asynchronous)


def test_tp2_penalties_bad_words_and_prompt_logprobs_match_tp1(qwen3_tp2_pair, qwen3_dir, qwen3_tp1_tokens):
    """Only rank 0 samples: its token counts, masks and the pending token of a multi-token bad word; prompt
    logprobs need every rank's LM head (vocabulary-split)."""
    toks = qwen3_tp1_tokens[0]
    params = [
        SamplingParams(
            temperature=0.0,
            max_tokens=12,
            ignore_eos=True,
            presence_penalty=0.5,
            frequency_penalty=0.5,
            repetition_penalty=1.3,
        ),
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, prompt_logprobs=2),
        SamplingParams(temperature=0.0, max_tokens=12, min_tokens=10, logit_bias={toks[3]: 2.0}),
        SamplingParams(
            temperature=0.0, max_tokens=12, ignore_eos=True, bad_words=["w"], bad_words_token_ids=[toks[2:5]]
        ),
    ]
    prompts = PROMPTS + [PROMPTS[0]]
    ref = LLM(qwen3_dir, **ENGINE).generate(prompts, params)
    for llm in qwen3_tp2_pair:
        outs = llm.generate(prompts, params)
        assert _summary(outs) == _summary(ref)
        got, want = outs[1].prompt_logprobs, ref[1].prompt_logprobs
        assert len(got) == len(PROMPTS[1]) and got[0] is None
        assert all(abs(g[t].logprob - w[t].logprob) < 1e-4 for g, w in zip(got[1:], want[1:]) for t in w)
    assert ref[3].outputs[0].token_ids != toks  # the bad word changed it


def test_tp2_async_abort_while_a_step_is_in_flight(qwen3_tp2_pair, qwen3_tp1_tokens):
    final = abort_second_while_in_flight(qwen3_tp2_pair[1].engine, PROMPTS[0], PROMPTS[1], GREEDY)
    assert [o.outputs[0].token_ids for o in final.values()] == [qwen3_tp1_tokens[0]]
    assert _all_blocks_free(qwen3_tp2_pair[1])


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_tp2_mp_matches_tp1_default_model(default_llm, tp2, async_scheduling):
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    prompts = ["The capital of France is", "def fibonacci(n):"]
    expected = tokens(default_llm, prompts, params)
    # 9 query / 3 KV heads: rank 0 gets 2 KV heads (6 query), rank 1 one (3 query)
    llm = tp2(None, attention_backend="CPU_ATTN", kv_cache_memory=32 << 20, async_scheduling=async_scheduling)
    assert tokens(llm, prompts, params) == expected


def test_tp2_ray_matches_tp1_tiny_qwen3(qwen3_dir, qwen3_tp1_tokens, tp2):
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False)
    try:
        for async_scheduling in (False, True):  # one after the other: each actor takes one of the 2 CPUs
            llm = tp2(qwen3_dir, distributed_executor_backend="ray", async_scheduling=async_scheduling)
            assert llm.engine.async_scheduling is async_scheduling
            assert tokens(llm) == qwen3_tp1_tokens
            assert _all_blocks_free(llm)
            if not async_scheduling:
                llm.engine.shutdown()
        engine = llm.engine  # async: an actor killed while steps are queued fails them, no hang
        engine.add_request(PROMPTS[1], SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True))
        engine.step()
        engine.step()
        pid = engine.executor.pids[1]
        os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(WorkerDiedError, match=rf"worker rank 1 \(pid {pid}, Ray actor\) died; pending"):
            while engine.has_unfinished_requests():
                engine.step()
        assert time.monotonic() - t0 < 10 and not engine.has_unfinished_requests()
    finally:
        ray.shutdown()


def test_async_engine_with_a_dead_worker_is_not_ready(qwen3_dir):
    """The server's engine after a worker died: the request in flight fails with EngineDeadError, and the
    engine is no longer ready (/health 503), new requests naming the dead worker, since every later step
    would fail the same way."""
    import asyncio

    from attnserve.config import build_engine_config
    from attnserve.engine.async_engine import AsyncLLMEngine, EngineDeadError, EngineNotReadyError

    engine = AsyncLLMEngine(build_engine_config(qwen3_dir, tensor_parallel_size=2, **ENGINE))
    engine.start()
    params = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)

    async def run() -> tuple[str, str]:
        await engine.wait_ready(120)
        pid = engine.engine.executor.pids[1]
        with pytest.raises(EngineDeadError) as dead:
            async for _ in engine.generate(PROMPTS[0], params, "a"):
                if pid:
                    os.kill(pid, signal.SIGKILL)
                    pid = 0
        assert not engine.is_ready
        with pytest.raises(EngineNotReadyError) as refused:
            async for _ in engine.generate(PROMPTS[0], params, "b"):
                pass
        await engine.shutdown(timeout=10)
        return str(dead.value), str(refused.value)

    try:
        dead, refused = asyncio.run(run())
    finally:
        engine.engine.shutdown()
    assert re.fullmatch(
        r"engine step failed: WorkerDiedError: worker rank 1 \(pid \d+\) died \(exit code -9\); "
        r"pending requests failed",
        dead,
    )
    assert refused == "the engine is dead: " + dead.removeprefix("engine step failed: ")


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_dead_worker_fails_pending_requests_quickly(qwen3_dir, tp2, async_scheduling):
    llm = tp2(qwen3_dir, async_scheduling=async_scheduling)
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


def test_worker_queues_the_next_step_before_the_last_ones_tokens_are_ready(monkeypatch):
    """run_worker with a stand-in Worker (in this process): steps 1 and 2 are both queued while step 1's tokens
    are not ready; rank 0's replies come in step order; a step whose tokens fail sends the error."""
    import multiprocessing
    import threading

    from attnserve.executor import worker as worker_module
    from attnserve.model_executor.model_runner import ModelRunnerOutput

    queued = []

    class Pending:
        def __init__(self, seq):
            self.seq, self.ready = seq, threading.Event()

        def result(self):
            assert self.ready.wait(30)
            if self.seq == 3:
                raise RuntimeError("device error in step 3")
            return ModelRunnerOutput(sampled={"r": (self.seq, None)})

    class StandIn:
        rank = 0

        def __init__(self, **kwargs):
            pass

        def info(self):
            return "info"

        def execute_async(self, seq):
            queued.append(Pending(seq))
            return queued[-1]

        def close(self):
            queued.append("closed")

    monkeypatch.setattr(worker_module, "Worker", StandIn)
    engine_end, worker_end = multiprocessing.Pipe()
    loop = threading.Thread(target=worker_module.run_worker, args=(worker_end, {}), daemon=True)
    loop.start()
    assert engine_end.recv() == ("ready", "info")
    engine_end.send(1)
    engine_end.send(2)
    deadline = time.monotonic() + 30
    while len(queued) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [p.seq for p in queued] == [1, 2]  # step 2 queued before step 1's tokens are ready
    queued[1].ready.set()
    assert not engine_end.poll(0.3)  # step 2's reply waits for step 1's
    queued[0].ready.set()
    assert engine_end.recv() == ("ok", ModelRunnerOutput(sampled={"r": (1, None)}))
    assert engine_end.recv() == ("ok", ModelRunnerOutput(sampled={"r": (2, None)}))
    engine_end.send(3)
    while len(queued) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    queued[2].ready.set()
    kind, error = engine_end.recv()
    assert kind == "error" and "device error in step 3" in error.traceback and abs(time.time() - error.time) < 60
    assert (error.message, error.key) == ("device error in step 3", None)  # not a ConfigError: no key
    engine_end.send(None)
    loop.join(30)
    assert not loop.is_alive() and queued[-1] == "closed"


def test_a_worker_that_raises_fails_the_step_with_its_traceback(qwen3_dir, tp2):
    """Both ranks raise on a step naming a request they never saw (async scheduling on): the step fails with
    the first failing rank's traceback, not as a clean exit of a dead worker; no worker is left running."""
    from attnserve.engine.request import PLACEHOLDER_TOKEN
    from attnserve.engine.scheduler import ScheduledRequest, SchedulerOutput

    llm = tp2(qwen3_dir, async_scheduling=True)
    assert len(tokens(llm, PROMPTS[:1])[0]) == GREEDY.max_tokens  # the ranks hold a last sample now
    ghost = ScheduledRequest("ghost", [PLACEHOLDER_TOKEN], 3, [1], SamplingParams(temperature=0.0), True)
    executor = llm.engine.executor
    t0 = time.monotonic()
    with pytest.raises(WorkerDiedError) as e:
        executor.execute_async(SchedulerOutput(requests=[ghost])).result()
    assert time.monotonic() - t0 < 10
    assert re.match(
        r"worker rank [01] \(pid \d+\) failed( \(then rank [01] too\))?; pending requests failed\. "
        r"Its traceback:\n",
        str(e.value),
    ), str(e.value)
    assert "KeyError: 'ghost'" in str(e.value)
    assert "\n" not in e.value.summary and e.value.summary.endswith("KeyError: 'ghost'"), e.value.summary
    for p in executor.procs:
        p.join(timeout=10)
    assert not any(p.is_alive() for p in executor.procs)
    with pytest.raises(WorkerDiedError, match="worker rank [01] .* failed"):  # later calls fail the same way
        llm.generate(PROMPTS[0], GREEDY)


def kv_budget_error(block_size: int) -> str:
    """The KV-cache budget error of 10 bytes: rank 0's block is 2 layers x block_size tokens x 1 of the 2 KV heads x
    head_dim 32 x (K, V) x 4 bytes (float32)."""
    return (
        f"KV-cache budget of 10 bytes holds no block of {2 * block_size * 32 * 2 * 4} bytes; raise kv_cache_memory "
        "or set num_gpu_blocks"
    )


def _tp_workers_alive() -> list:
    """This process's live worker processes (spawned by MultiprocExecutor)."""
    import multiprocessing

    return [p for p in multiprocessing.active_children() if p.name.startswith("attnserve-tp")]


def test_a_setting_a_worker_refuses_keeps_its_key_across_the_process_boundary(qwen3_dir):
    """Each rank sizes its own KV cache: a budget that holds no block is refused in the workers. The engine raises
    it as one process would (the message and key of the workers' ConfigError, a ValueError), not as a
    WorkerDiedError that names no setting; it is a WorkerDiedError too (no worker is left running)."""
    from attnserve.config import ConfigError
    from attnserve.executor.base import WorkerConfigError

    before = _tp_workers_alive()  # other tests' engines (module fixtures) may still run theirs
    with pytest.raises(WorkerConfigError) as e:
        LLM(qwen3_dir, tensor_parallel_size=2, **{**ENGINE, "kv_cache_memory": 10})
    assert isinstance(e.value, ConfigError) and isinstance(e.value, WorkerDiedError)
    assert (str(e.value), e.value.key) == (kv_budget_error(ENGINE["block_size"]), "kv_cache_memory")
    assert [p for p in _tp_workers_alive() if p not in before] == []


def test_the_cli_names_the_flag_of_a_setting_a_worker_refused(qwen3_dir, capsys):
    """``generate --tensor-parallel-size 2``: one line naming the flag and exit 2, as with one process (was a
    traceback of WorkerDiedError, exit 1)."""
    from attnserve.entrypoints.cli.main import main

    assert (
        main(
            [
                "generate",
                "--model",
                qwen3_dir,
                "--device",
                "cpu",
                "--tensor-parallel-size",
                "2",
                "--kv-cache-memory",
                "10",
            ]
        )
        == 2
    )
    cli_words = kv_budget_error(16).replace(
        "raise kv_cache_memory or set num_gpu_blocks", "raise --kv-cache-memory or set --num-gpu-blocks"
    )  # advice in flags
    assert capsys.readouterr().err == f"attnserve generate: error: argument --kv-cache-memory: {cli_words}\n"


def test_a_setting_a_ray_actor_refuses_keeps_its_key(qwen3_dir):
    """The same with Ray actors: a ConfigError while an actor is built reaches the engine with its key (Ray passes
    on only the text of an actor constructor's error: the actor raises it from its first call instead)."""
    ray = pytest.importorskip("ray")
    from attnserve.executor.base import WorkerConfigError

    ray.init(num_cpus=2, include_dashboard=False)
    try:
        with pytest.raises(WorkerConfigError) as e:
            LLM(
                qwen3_dir,
                tensor_parallel_size=2,
                distributed_executor_backend="ray",
                **{**ENGINE, "kv_cache_memory": 10},
            )
        assert (str(e.value), e.value.key) == (kv_budget_error(ENGINE["block_size"]), "kv_cache_memory")
    finally:
        ray.shutdown()


def test_bench_latency_compares_tp_sizes_in_one_run(qwen3_dir, tmp_path):
    import json

    from attnserve.entrypoints.cli.main import main

    out = tmp_path / "lat.json"
    rc = main(
        [
            "bench",
            "latency",
            "--model",
            qwen3_dir,
            "--load-format",
            "dummy",
            "--batch-size",
            "1",
            "--input-len",
            "8",
            "--output-len",
            "4",
            "--num-iters",
            "1",
            "--num-iters-warmup",
            "0",
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--kv-cache-memory",
            str(8 << 20),
            "--compare-tensor-parallel-sizes",
            "1",
            "2",
            "--output-json",
            str(out),
            "--no-progress",
        ]
    )
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
    llm = tp2(qwen3_dir, async_scheduling=True)  # a reply thread in rank 0's worker must not keep it alive
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
    from attnserve.distributed.sharding import check_gpu_count
    from attnserve.platforms.interface import Platform

    monkeypatch.setattr(platforms, "detect_platform", lambda device: Platform("cuda", "test GPU", (9, 0)))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    with pytest.raises(
        ValueError,
        match=r"tensor_parallel_size 2 needs 2 GPUs \(one per rank\); this host shows 1 "
        r"\(CUDA_VISIBLE_DEVICES=3\)",
    ) as e:
        check_gpu_count("cuda", 2)
    assert e.value.key == "tensor_parallel_size"  # the CLI names --tensor-parallel-size
    check_gpu_count("cuda", 1)
