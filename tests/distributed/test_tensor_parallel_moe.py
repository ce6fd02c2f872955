"""Tensor parallelism of the mixture-of-experts models on CPU (gloo): every expert's intermediate dimension split
over 2 ranks (one all-reduce after the experts) gives exactly TP=1's greedy tokens, for Qwen3-MoE (dense and
sparse layers) and Mixtral (uneven splits: ``tests/kernels/test_moe.py``)."""

from __future__ import annotations

import pytest

from attnserve import LLM, SamplingParams

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], list(range(100, 137)), [42]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
ENGINE = dict(dtype="float32", device="cpu", block_size=4, kv_cache_memory=8 << 20)


def tokens(llm: LLM) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)]


@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral"])
def test_tp2_matches_tp1(arch, tiny_model_dir):
    path = tiny_model_dir(arch)
    reference = tokens(LLM(path, **ENGINE))
    llm = LLM(path, tensor_parallel_size=2, **ENGINE)
    try:
        assert llm.engine.info.tensor_parallel_size == 2
        assert tokens(llm) == reference
    finally:
        llm.engine.shutdown()
