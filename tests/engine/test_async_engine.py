"""AsyncLLMEngine on a tiny random Llama: streaming outputs, and begin_shutdown (abort, drain) at shutdown."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from attnserve.config import build_engine_config
from attnserve.engine.async_engine import AsyncLLMEngine, EngineNotReadyError
from attnserve.engine.llm_engine import LLMEngine
from attnserve.engine.sampling_params import SamplingParams

LONG = SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True)


def _engine(tiny_model_dir) -> AsyncLLMEngine:
    config = build_engine_config(tiny_model_dir("llama"), dtype="float32", device="cpu", kv_cache_memory=8 << 20)
    engine = AsyncLLMEngine(config)
    engine.start()
    return engine


async def _consume(engine: AsyncLLMEngine, rid: str, params: SamplingParams, on_second=None) -> list:
    """The request's outputs; calls ``on_second()`` once the second one arrived."""
    outs = []
    async for out in engine.generate([5, 6, 7], params, rid):
        outs.append(out)
        if len(outs) == 2 and on_second is not None:
            on_second()
    return outs


def test_begin_shutdown_aborts_every_stream_with_a_final_output_and_frees_the_cache(tiny_model_dir, caplog):
    engine = _engine(tiny_model_dir)

    async def run() -> list:
        await engine.wait_ready(120)
        results = await asyncio.gather(
            _consume(engine, "a", LONG, on_second=engine.begin_shutdown), _consume(engine, "b", LONG)
        )
        with pytest.raises(EngineNotReadyError, match="shutting down"):  # no new requests after begin_shutdown
            async for _ in engine.generate([1], LONG, "c"):
                pass
        await engine.shutdown(timeout=10)
        return results

    with caplog.at_level(logging.INFO, logger="attnserve.engine.async_engine"):
        results = asyncio.run(run())
    for outs in results:  # each stream ends normally, its last output finished with "abort"
        last = outs[-1]
        assert last.finished and not any(o.finished for o in outs[:-1])
        assert last.outputs[0].finish_reason == "abort" and 0 < len(last.outputs[0].token_ids) < 400
    assert engine.engine.block_manager.num_free_blocks == engine.engine.block_manager.num_blocks
    assert [r.getMessage() for r in caplog.records if "shutting down" in r.getMessage()] == [
        "shutting down: aborted 2 requests in flight"
    ]


class _SlowEngine(LLMEngine):
    """Steps no faster than one per 10 ms: a 500-token request lasts over 5 s on any machine."""

    def step(self):
        time.sleep(0.01)
        return super().step()


def test_begin_shutdown_with_a_drain_timeout_lets_requests_finish_until_the_deadline(tiny_model_dir):
    """During the drain a request that ends in time finishes as usual and a new one is refused at once;
    the rest are aborted at the deadline, not before."""
    config = build_engine_config(tiny_model_dir("llama"), dtype="float32", device="cpu", kv_cache_memory=8 << 20)
    engine = AsyncLLMEngine(config, engine_factory=_SlowEngine)
    engine.start()
    short = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    very_long = SamplingParams(temperature=0.0, max_tokens=500, ignore_eos=True)
    drain = 1.0
    began = []

    def begin() -> None:
        began.append(time.monotonic())
        engine.begin_shutdown(drain_timeout=drain)

    async def run():
        await engine.wait_ready(120)
        long_task = asyncio.ensure_future(_consume(engine, "long", very_long))
        short_outs = await _consume(engine, "short", short, on_second=begin)  # one step left when it begins
        with pytest.raises(EngineNotReadyError, match="shutting down"):
            async for _ in engine.generate([1], short, "new"):
                pass
        long_outs = await long_task
        ended = time.monotonic()
        await engine.shutdown(timeout=10)
        return long_outs, short_outs, ended

    long_outs, short_outs, ended = asyncio.run(run())
    assert short_outs[-1].outputs[0].finish_reason == "length"
    assert long_outs[-1].outputs[0].finish_reason == "abort"
    assert ended - began[0] >= drain - 0.05
    assert engine.engine.block_manager.num_free_blocks == engine.engine.block_manager.num_blocks


def test_shutdown_stops_the_tensor_parallel_workers(tiny_model_dir):
    """Not left to a finalizer at interpreter exit (where multiprocessing may terminate them first)."""
    config = build_engine_config(
        tiny_model_dir("llama"), dtype="float32", device="cpu", kv_cache_memory=8 << 20, tensor_parallel_size=2
    )
    engine = AsyncLLMEngine(config)
    engine.start()

    async def run():
        await engine.wait_ready(300)
        outs = await _consume(engine, "a", SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
        await engine.shutdown(timeout=10)
        return outs

    assert asyncio.run(run())[-1].outputs[0].finish_reason == "length"
    procs = engine.engine.executor.procs
    assert len(procs) == 2 and not any(p.is_alive() for p in procs)
    assert [p.exitcode for p in procs] == [0, 0]
