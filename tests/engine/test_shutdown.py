"""LLMEngine.shutdown() frees what the engine held: a second engine in the same process gets the memory."""

from __future__ import annotations

import gc
import weakref

from attnserve import LLM, SamplingParams


def test_shutdown_releases_the_kv_cache_and_weights(tiny_model_dir):
    llm = LLM(tiny_model_dir("llama"), dtype="float32", device="cpu", block_size=4, kv_cache_memory=8 << 20)
    llm.generate(["hello"], SamplingParams(max_tokens=2))
    runner = llm.engine.executor.runner
    held = [weakref.ref(runner.kv_caches[0]), weakref.ref(next(runner.model.parameters()))]
    del runner
    llm.engine.shutdown()
    llm.engine.shutdown()  # idempotent
    gc.collect()
    assert llm.engine.executor.runner is None
    assert [r() is None for r in held] == [True, True]
