"""Async scheduling (step k+1 scheduled before step k's tokens are read) gives exactly the synchronous
engine's outputs: tiny random Llama, CPU, float32, with preemption, chunked prefill, every stop rule,
seeded sampling, logprobs, n > 1 and aborts."""

from __future__ import annotations

import pytest

from attnserve import LLM, SamplingParams
from attnserve.config import build_engine_config
from attnserve.engine.block_manager import BlockManager
from attnserve.engine.request import PLACEHOLDER_TOKEN, Request
from attnserve.engine.scheduler import Scheduler
from tests.helpers import abort_second_while_in_flight

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], list(range(100, 137)), [42], list(range(300, 318))]
GREEDY = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)


@pytest.fixture(scope="module")
def llama_dir(tiny_model_dir):
    return tiny_model_dir("llama")


def _pair(llama_dir, **kwargs) -> tuple[LLM, LLM]:
    args = dict(dtype="float32", device="cpu", block_size=4, kv_cache_memory=8 << 20) | kwargs
    return LLM(llama_dir, async_scheduling=False, **args), LLM(llama_dir, async_scheduling=True, **args)


def _summary(outs) -> list:
    """Everything but the logprobs' values, which must agree to float32 rounding (see _logprobs_close)."""
    return [
        [(c.token_ids, c.text, c.finish_reason, c.stop_reason, _logprob_ids(c.logprobs)) for c in o.outputs]
        for o in outs
    ]


def _logprob_ids(logprobs) -> list | None:  # per token: [(token id, rank, decoded token)]
    return None if logprobs is None else [[(t, lp.rank, lp.decoded_token) for t, lp in d.items()] for d in logprobs]


def _logprobs_close(a, b, tol: float = 1e-5) -> bool:
    """Async computes (and drops) one more step for a request that ends on a stop token, so the other rows'
    batch shape, hence their float32 sums, can differ from the synchronous run's: values agree to ~1e-6."""
    for oa, ob in zip(a, b):
        for ca, cb in zip(oa.outputs, ob.outputs):
            for da, db in zip(ca.logprobs or [], cb.logprobs or []):
                if any(abs(da[t].logprob - db[t].logprob) > tol for t in da):
                    return False
    return True


@pytest.fixture(scope="module")
def pair(llama_dir):
    return _pair(llama_dir)


def test_async_is_on_only_when_asked_on_cpu(pair):
    sync, asynchronous = pair
    assert (sync.engine.async_scheduling, asynchronous.engine.async_scheduling) == (False, True)
    assert build_engine_config(None, device="cpu").scheduler.async_scheduling is None


def test_greedy_tokens_equal(pair):
    sync, asynchronous = pair
    assert _summary(asynchronous.generate(PROMPTS, GREEDY)) == _summary(sync.generate(PROMPTS, GREEDY))
    assert asynchronous.engine.block_manager.num_free_blocks == asynchronous.engine.block_manager.num_blocks
    assert asynchronous.engine._in_flight is None


def test_stop_token_max_tokens_stop_string_and_logprobs_equal(pair):
    sync, asynchronous = pair
    free_run = [o.outputs[0].token_ids for o in sync.generate(PROMPTS, GREEDY)]
    # stop on a token each request generates mid-way (EOS is rare for random weights)
    params = [
        SamplingParams(temperature=0.0, max_tokens=3 + i, stop_token_ids=[toks[2]], logprobs=2)
        for i, toks in enumerate(free_run)
    ]
    params[3] = SamplingParams(
        temperature=0.0, max_tokens=20, ignore_eos=True, stop=[sync.tokenizer.decode(free_run[3][4:6])]
    )
    a, s = asynchronous.generate(PROMPTS, params), sync.generate(PROMPTS, params)
    assert _summary(a) == _summary(s)
    assert _logprobs_close(a, s)
    assert [len(o.outputs[0].token_ids) for o in s][:3] == [3, 3, 3]  # stopped by the stop token
    assert s[3].outputs[0].finish_reason == "stop"
    assert asynchronous.engine.block_manager.num_free_blocks == asynchronous.engine.block_manager.num_blocks


def test_seeded_sampling_and_n_equal(pair):
    sync, asynchronous = pair
    params = SamplingParams(temperature=1.0, top_k=20, seed=7, n=2, max_tokens=12, ignore_eos=True)
    assert _summary(asynchronous.generate(PROMPTS, params)) == _summary(sync.generate(PROMPTS, params))


def test_preemption_and_chunked_prefill_equal(llama_dir):
    small_sync, small_async = _pair(llama_dir, num_gpu_blocks=20, kv_cache_memory=None)
    s, a = small_sync.generate(PROMPTS, GREEDY), small_async.generate(PROMPTS, GREEDY)
    assert _summary(a) == _summary(s)
    assert sum(o.num_preemptions for o in a) > 0
    assert small_async.engine.block_manager.num_free_blocks == 20
    chunk_sync, chunk_async = _pair(llama_dir, max_num_batched_tokens=5)
    assert _summary(chunk_async.generate(PROMPTS, GREEDY)) == _summary(chunk_sync.generate(PROMPTS, GREEDY))


def test_abort_while_a_step_is_in_flight(pair):
    sync, asynchronous = pair
    engine = asynchronous.engine
    final = abort_second_while_in_flight(engine, PROMPTS[0], PROMPTS[1], GREEDY)
    assert [o.outputs[0].token_ids for o in final.values()] == [
        sync.generate([PROMPTS[0]], GREEDY)[0].outputs[0].token_ids
    ]
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_scheduler_feeds_the_pending_token_as_a_placeholder_and_stops_at_the_length_limit():
    scheduler = Scheduler(BlockManager(16, 4), max_num_batched_tokens=64, max_num_seqs=4)
    req = Request("r", [1, 2, 3], SamplingParams(max_tokens=2), eos_token_id=None, max_model_len=64)
    scheduler.add_request(req)
    first = scheduler.schedule()  # prefill: samples token 1 (pending)
    assert first.requests[0].token_ids == [1, 2, 3] and first.requests[0].samples and req.num_pending == 1
    second = scheduler.schedule()  # before token 1 is known: decode it from the device
    assert second.requests[0].token_ids == [PLACEHOLDER_TOKEN]
    assert second.requests[0].start_position == 3 and req.num_pending == 2
    assert scheduler.schedule().is_empty  # tokens 1 and 2 in flight reach max_tokens 2
    scheduler.update(first, {"r": (9, None)})
    assert req.output_token_ids == [9] and req.num_pending == 1
    assert scheduler.schedule().is_empty
    scheduler.update(second, {"r": (8, None)})
    assert req.output_token_ids == [9, 8] and req.is_finished


@pytest.mark.parametrize("executor", ["mp", "ray"])
def test_async_scheduling_is_allowed_and_the_gpu_default_with_tensor_parallelism(executor):
    import torch

    from attnserve.engine.llm_engine import resolve_async_scheduling

    config = build_engine_config(
        None, tensor_parallel_size=2, distributed_executor_backend=executor, async_scheduling=True
    )
    assert config.scheduler.async_scheduling is True
    auto = build_engine_config(None, tensor_parallel_size=2, distributed_executor_backend=executor)
    assert resolve_async_scheduling(auto, torch.device("cuda", 0)) is True
    assert resolve_async_scheduling(auto, torch.device("cpu")) is False
    assert (
        resolve_async_scheduling(
            build_engine_config(None, tensor_parallel_size=2, async_scheduling=False), torch.device("cuda", 0)
        )
        is False
    )
