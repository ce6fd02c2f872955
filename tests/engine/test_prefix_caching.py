"""Automatic prefix caching end to end on a tiny random Llama (CPU, float32): every case gives the tokens it
gives with caching off, and the cached tokens are really skipped (counted per request and in the stats)."""

from __future__ import annotations

import pytest

from attnserve import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
SHARED = list(range(200, 241))  # 41 tokens: 10 full blocks of 4 and one token of the 11th
BATCH = [SHARED + [300 + i, 301 + i, 302 + i] for i in range(4)]  # a long shared prefix, in one batch
INSIDE = [SHARED[:22] + [400, 401, 402], SHARED[:22] + [500, 501]]  # the common prefix ends inside a block
BACKENDS = ["CPU_ATTN", "FLEX_ATTENTION"]


@pytest.fixture(scope="module")
def llama_dir(tiny_model_dir):
    return tiny_model_dir("llama")


def make(llama_dir, backend: str, caching: bool, **kwargs) -> LLM:
    args = dict(dtype="float32", device="cpu", block_size=4, kv_cache_memory=8 << 20, attention_backend=backend)
    return LLM(llama_dir, enable_prefix_caching=caching, **{**args, **kwargs})


@pytest.fixture(scope="module", params=BACKENDS)
def pair(request, llama_dir):
    """(caching off, caching on) engines of one backend."""
    return make(llama_dir, request.param, False), make(llama_dir, request.param, True)


def tokens(outs) -> list[list[list[int]]]:
    return [[c.token_ids for c in o.outputs] for o in outs]


def test_a_batch_sharing_a_long_prefix(pair):
    off, on = pair
    on.reset_prefix_cache()
    before = on.engine.scheduler.prefix_cache_stats.hits
    outs = on.generate(BATCH, GREEDY)
    assert tokens(outs) == tokens(off.generate(BATCH, GREEDY))
    # admitted in one step: the first computes the prefix, the others read its 10 full blocks
    assert [o.num_cached_tokens for o in outs] == [0, 40, 40, 40]
    assert on.engine.scheduler.prefix_cache_stats.hits - before == 120


def test_a_common_prefix_that_ends_inside_a_block(pair):
    off, on = pair
    on.reset_prefix_cache()
    outs = [on.generate([p], GREEDY)[0] for p in INSIDE]
    assert tokens(outs) == tokens(off.generate(INSIDE, GREEDY))
    assert [o.num_cached_tokens for o in outs] == [0, 20]  # 22 shared tokens: 5 full blocks


def test_a_prompt_that_repeats_an_earlier_one_exactly(pair):
    off, on = pair
    on.reset_prefix_cache()
    first, again = on.generate([BATCH[0]], GREEDY)[0], on.generate([BATCH[0]], GREEDY)[0]
    assert tokens([first]) == tokens([again]) == tokens(off.generate([BATCH[0]], GREEDY))
    assert (first.num_cached_tokens, again.num_cached_tokens) == (0, 40)  # 44 tokens: the last is computed
    on.reset_prefix_cache()
    assert on.generate([BATCH[0]], GREEDY)[0].num_cached_tokens == 0


def test_n_completions_share_their_prompt(pair):
    off, on = pair
    on.reset_prefix_cache()
    params = SamplingParams(temperature=0.8, seed=3, n=3, max_tokens=10, ignore_eos=True)
    before = on.engine.scheduler.prefix_cache_stats.hits
    out = on.generate([BATCH[1]], params)
    assert tokens(out) == tokens(off.generate([BATCH[1]], params))
    assert on.engine.scheduler.prefix_cache_stats.hits - before == 2 * 40  # completions 2 and 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_preemption_under_a_tiny_kv_cache(llama_dir, backend):
    # 24 blocks of 4 tokens: 96 positions for four requests of 44 + 12 tokens each
    off = make(llama_dir, backend, False, num_gpu_blocks=24, kv_cache_memory=None)
    on = make(llama_dir, backend, True, num_gpu_blocks=24, kv_cache_memory=None)
    outs = on.generate(BATCH, GREEDY)
    assert tokens(outs) == tokens(off.generate(BATCH, GREEDY))
    assert sum(o.num_preemptions for o in outs) > 0
    st = on.engine.scheduler.prefix_cache_stats  # recomputes count apart: the prompts' lookups add up
    assert (st.requests, st.queries) == (4, sum(map(len, BATCH)))
    assert st.hits == sum(o.num_cached_tokens for o in outs) and st.preempted_requests > 0
    bm = on.engine.block_manager
    assert bm.num_free_blocks == 24 and set(bm.ref_counts) == {0}  # none leaked


@pytest.mark.parametrize("backend", BACKENDS)
def test_chunked_prefill_with_a_small_token_budget(llama_dir, backend):
    off = make(llama_dir, backend, False, max_num_batched_tokens=16)
    on = make(llama_dir, backend, True, max_num_batched_tokens=16)
    outs = on.generate(BATCH, GREEDY)
    assert tokens(outs) == tokens(off.generate(BATCH, GREEDY))
    assert sum(o.num_cached_tokens for o in outs) > 0


def test_async_scheduling_with_prefix_caching(llama_dir):
    off = make(llama_dir, "CPU_ATTN", False)
    on = make(llama_dir, "CPU_ATTN", True, async_scheduling=True, max_num_batched_tokens=16)
    assert on.engine.async_scheduling
    prompts = BATCH + INSIDE
    outs = on.generate(prompts, GREEDY)
    assert tokens(outs) == tokens(off.generate(prompts, GREEDY))
    # blocks filled by decoded tokens are cached too: the prompt plus its answer is found again
    first = outs[0]
    follow_up = BATCH[0] + first.outputs[0].token_ids + [7, 8]
    again = on.generate([follow_up], GREEDY)[0]
    assert again.num_cached_tokens == (len(BATCH[0]) + 12 - 1) // 4 * 4
    assert tokens([again]) == tokens(off.generate([follow_up], GREEDY))
