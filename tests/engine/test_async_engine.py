"""AsyncLLMEngine on a tiny random Llama: streaming outputs, and abort_all at shutdown."""

from __future__ import annotations

import asyncio

import pytest

from attnserve.config import build_engine_config
from attnserve.engine.async_engine import AsyncLLMEngine, EngineNotReadyError, RequestAbortedError
from attnserve.engine.sampling_params import SamplingParams


def test_abort_all_ends_every_stream_and_frees_the_cache(tiny_model_dir):
    config = build_engine_config(tiny_model_dir("llama"), dtype="float32", device="cpu", kv_cache_memory=8 << 20)
    engine = AsyncLLMEngine(config)
    engine.start()

    async def run() -> list:
        await engine.wait_ready(120)
        params = SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True)

        async def consume(rid: str):
            got = 0
            try:
                async for _ in engine.generate([5, 6, 7], params, rid):
                    got += 1
                    if got == 2 and rid == "a":
                        engine.abort_all()
            except RequestAbortedError as e:
                return str(e)
            return "finished"

        results = await asyncio.gather(consume("a"), consume("b"))
        with pytest.raises(EngineNotReadyError, match="shutting down"):  # no new requests after abort_all
            async for _ in engine.generate([1], params, "c"):
                pass
        await engine.shutdown(timeout=10)
        return results

    results = asyncio.run(run())
    assert results == ["request a was aborted (the server is shutting down)",
                       "request b was aborted (the server is shutting down)"]
    assert engine.engine.block_manager.num_free_blocks == engine.engine.block_manager.num_blocks
