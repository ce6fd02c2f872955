"""End-to-end engine behaviour on a tiny random Llama (CPU, float32): preemption, chunked prefill,
sampling options, stop conditions, logprobs, and bad input."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from attnserve import LLM, SamplingParams
from attnserve.engine.sampling_params import SamplingParamsError

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], list(range(100, 137)), [42], list(range(300, 318))]
GREEDY = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)


@pytest.fixture(scope="module")
def llama_dir(tiny_model_dir):
    return tiny_model_dir("llama")


@pytest.fixture(scope="module")
def llm(llama_dir):
    return LLM(llama_dir, dtype="float32", device="cpu", block_size=4, kv_cache_memory=8 << 20)


@pytest.fixture(scope="module")
def reference_tokens(llm):
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)]


def test_preemption_with_a_small_kv_cache_gives_the_same_tokens(llama_dir, reference_tokens):
    # 20 blocks of 4 tokens hold 80 positions; the four requests need 27 + 57 + 21 + 38 = 143
    small = LLM(llama_dir, dtype="float32", device="cpu", block_size=4, num_gpu_blocks=20)
    outs = small.generate(PROMPTS, GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == reference_tokens
    assert sum(o.num_preemptions for o in outs) > 0  # the cache really was too small
    assert small.engine.scheduler.num_preemptions == sum(o.num_preemptions for o in outs)  # /metrics' count
    assert small.engine.block_manager.num_free_blocks == 20


def test_chunked_prefill_off_with_a_tiny_kv_cache_finishes_every_request(llama_dir, llm):
    # prompts fit one 20-token step, but requests preempted after growing past 20 tokens must still finish
    prompts = [PROMPTS[0], PROMPTS[3], list(range(400, 418))]
    small = LLM(
        llama_dir,
        dtype="float32",
        device="cpu",
        block_size=4,
        num_gpu_blocks=12,
        max_num_batched_tokens=20,
        enable_chunked_prefill=False,
        enable_prefix_caching=False,
    )
    outs = small.generate(prompts, GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
    assert sum(o.num_preemptions for o in outs) > 0


def test_chunked_prefill_with_a_small_token_budget_gives_the_same_tokens(llama_dir, reference_tokens):
    chunked = LLM(
        llama_dir, dtype="float32", device="cpu", block_size=4, max_num_batched_tokens=5, kv_cache_memory=8 << 20
    )
    outs = chunked.generate(PROMPTS, GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == reference_tokens


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_request_that_outgrows_the_whole_kv_cache_ends_with_length(llama_dir, reference_tokens, async_scheduling):
    """3 blocks of 4 tokens hold 12 positions, fewer than max_model_len: a lone request of 7 prompt tokens
    stops after 5 generated tokens (finish_reason length, as at max_model_len) instead of preempting itself
    and waiting forever for blocks that can never be free."""
    small = LLM(
        llama_dir, dtype="float32", device="cpu", block_size=4, num_gpu_blocks=3, async_scheduling=async_scheduling
    )
    engine = small.engine
    assert engine.async_scheduling is async_scheduling
    assert engine.max_model_len > 12
    engine.add_request(PROMPTS[0], GREEDY)
    final = None
    for _ in range(50):  # a bounded loop: the bug was a busy loop of empty steps
        for o in engine.step():
            final = o if o.finished else final
        if not engine.has_unfinished_requests():
            break
    assert final is not None, "the request never finished"
    out = final.outputs[0]
    assert out.token_ids == reference_tokens[0][:5] and out.finish_reason == "length"
    assert engine.block_manager.num_free_blocks == 3


def test_one_prompt_at_a_time_equals_the_batch(llm, reference_tokens):
    for prompt, ref in zip(PROMPTS, reference_tokens):
        assert llm.generate([prompt], GREEDY)[0].outputs[0].token_ids == ref


def test_seeded_sampling_is_reproducible_and_differs_across_seeds(llm):
    p = lambda seed: SamplingParams(
        temperature=1.0, top_p=0.9, top_k=50, min_p=0.01, seed=seed, max_tokens=16, ignore_eos=True
    )
    a = llm.generate(PROMPTS[:2], p(1))
    b = llm.generate(PROMPTS[:2], p(1))
    c = llm.generate(PROMPTS[:2], p(2))
    assert [o.outputs[0].token_ids for o in a] == [o.outputs[0].token_ids for o in b]
    assert [o.outputs[0].token_ids for o in a] != [o.outputs[0].token_ids for o in c]


def test_top_k_one_is_greedy(llm, reference_tokens):
    out = llm.generate(PROMPTS[0], SamplingParams(temperature=0.8, top_k=1, max_tokens=20, ignore_eos=True, seed=3))
    assert out[0].outputs[0].token_ids == reference_tokens[0]


def test_n_completions(llm):
    out = llm.generate(PROMPTS[1], SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=8, ignore_eos=True))[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert all(len(c.token_ids) == 8 for c in out.outputs)
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1


def test_max_tokens_and_stop_token_ids(llm, reference_tokens):
    ref = reference_tokens[1]
    out = llm.generate(PROMPTS[1], SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True))[0].outputs[0]
    assert out.token_ids == ref[:5] and out.finish_reason == "length"
    stop_id = ref[3]
    first = ref.index(stop_id)
    out = llm.generate(
        PROMPTS[1], SamplingParams(temperature=0.0, max_tokens=20, stop_token_ids=[stop_id], ignore_eos=True)
    )[0].outputs[0]
    assert out.token_ids == ref[: first + 1] and out.finish_reason == "stop" and out.stop_reason == stop_id


@pytest.mark.parametrize("ignore_eos", [False, True])
def test_eos_stops_unless_ignored(llm, reference_tokens, ignore_eos):
    # declare the 4th greedy token to be EOS: generation stops right after it unless ignore_eos
    from attnserve.engine.request import Request

    ref = reference_tokens[1]
    eos = ref[3]
    r = Request(
        "x",
        PROMPTS[1],
        SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=ignore_eos),
        eos_token_id=eos,
        max_model_len=512,
    )
    llm.engine.scheduler.add_request(r)
    while llm.engine.has_unfinished_requests():
        llm.engine.step()
    expected = ref if ignore_eos else ref[: ref.index(eos) + 1]
    assert r.output_token_ids == expected
    assert r.finish_reason.value == ("length" if ignore_eos else "stop")


def test_stop_string_truncates_text(llm):
    full = llm.generate(PROMPTS[3], GREEDY)[0].outputs[0].text
    assert len(full) > 6
    stop = full[3:6]
    out = llm.generate(PROMPTS[3], SamplingParams(temperature=0.0, max_tokens=20, stop=[stop], ignore_eos=True))[
        0
    ].outputs[0]
    assert out.text == full[: full.index(stop)]
    assert out.finish_reason == "stop" and out.stop_reason == stop


def _stream(engine, prompt, params) -> tuple[list[str], list[str], object]:
    """Step one request to the end: (each step's text_delta, each step's text, the final completion)."""
    engine.add_request(prompt, params)
    deltas, texts = [], []
    while engine.has_unfinished_requests():
        for o in engine.step():
            deltas.append(o.outputs[0].text_delta)
            texts.append(o.outputs[0].text)
            final = o.outputs[0]
    return deltas, texts, final


def test_streamed_text_never_shows_part_of_a_stop_string(llm):
    """A stop string spanning two tokens: the step that ends in its first character must not stream that
    character (vLLM holds back len(longest stop) - 1 characters), so the deltas add up to the final text
    and every step's text is a prefix of it."""
    deltas, _, full = _stream(llm.engine, PROMPTS[3], GREEDY)
    ends = [sum(map(len, deltas[: i + 1])) for i in range(len(deltas))]
    # a boundary between two non-empty token texts where the two characters around it first occur
    b = next(
        e
        for e, d, nxt in zip(ends, deltas, deltas[1:])
        if d and nxt and full.text.index(full.text[e - 1 : e + 1]) == e - 1
    )
    stop = full.text[b - 1 : b + 1]
    deltas, texts, out = _stream(
        llm.engine, PROMPTS[3], SamplingParams(temperature=0.0, max_tokens=20, stop=[stop], ignore_eos=True)
    )
    assert out.text == full.text[: b - 1] and out.finish_reason == "stop" and out.stop_reason == stop
    assert "".join(deltas) == out.text
    assert all(out.text.startswith(t) for t in texts)
    # a stop string longer than the whole text that never matches: all of it comes out at the end
    deltas, texts, out = _stream(
        llm.engine, PROMPTS[3], SamplingParams(temperature=0.0, max_tokens=20, stop=["\x00" * 200], ignore_eos=True)
    )
    assert out.text == full.text and out.finish_reason == "length" and "".join(deltas) == full.text
    assert set(texts[:-1]) == {""}


def test_logprobs_of_sampled_and_top_tokens(llm):
    out = llm.generate(PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=4, logprobs=3, ignore_eos=True))[
        0
    ].outputs[0]
    assert len(out.logprobs) == 4
    runner = llm.engine.runner
    from attnserve.engine.scheduler import ScheduledRequest, SchedulerOutput

    logits = runner.compute_logits(
        SchedulerOutput([ScheduledRequest("lp", PROMPTS[0], 0, list(range(2)), GREEDY, True)])
    )[0]
    expected = torch.log_softmax(logits, -1)
    first = out.logprobs[0]
    top3 = torch.topk(expected, 3)
    assert list(first)[:1] == [out.token_ids[0]] and first[out.token_ids[0]].rank == 1
    assert {t: round(lp.logprob, 4) for t, lp in first.items()} == {
        t: round(v, 4) for t, v in zip(top3.indices.tolist(), top3.values.tolist())
    }


def _sampled_sum(completion) -> float:
    total = 0.0
    for token_id, step in zip(completion.token_ids, completion.logprobs):
        total += step[token_id].logprob
    return total


@pytest.mark.parametrize("k", [0, 3])
def test_cumulative_logprob_is_the_sum_of_the_sampled_tokens_logprobs(llm, k):
    """vLLM's CompletionOutput.cumulative_logprob: the sampled tokens' logprobs summed (logprobs=0 too),
    per completion, on every step's output; sampled tokens that are not the most likely count as sampled."""
    params = SamplingParams(temperature=1.0, seed=7, n=2, max_tokens=12, ignore_eos=True, logprobs=k)
    outs = llm.generate(PROMPTS[:2], params)
    for completion in (c for o in outs for c in o.outputs):
        assert len(completion.logprobs) == 12
        assert completion.cumulative_logprob == _sampled_sum(completion) < 0
    ranks = [step[t].rank for c in outs[0].outputs for t, step in zip(c.token_ids, c.logprobs)]
    assert max(ranks) > 1  # temperature 1 sampled some token that is not the top one
    # the first token's logprob, from the model's logits
    runner = llm.engine.runner
    from attnserve.engine.scheduler import ScheduledRequest, SchedulerOutput

    logits = runner.compute_logits(
        SchedulerOutput([ScheduledRequest("lp", PROMPTS[0], 0, list(range(2)), GREEDY, True)])
    )[0]
    first = outs[0].outputs[0].token_ids[0]
    assert outs[0].outputs[0].logprobs[0][first].logprob == pytest.approx(
        torch.log_softmax(logits, -1)[first].item(), abs=1e-5
    )
    # each step's output carries the sum so far; a snapshot keeps its value
    engine = llm.engine
    engine.add_request(PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, logprobs=0))
    sums, snaps = [], []
    while engine.has_unfinished_requests():
        out = engine.step()[0]
        snaps.append(out.snapshot())
        sums.append(out.outputs[0].cumulative_logprob)
    lps = [step[t].logprob for t, step in zip(out.outputs[0].token_ids, out.outputs[0].logprobs)]
    assert sums == [lps[0], lps[0] + lps[1], lps[0] + lps[1] + lps[2]]
    assert [s.outputs[0].cumulative_logprob for s in snaps] == sums


def test_cumulative_logprob_is_none_without_logprobs(llm):
    out = llm.generate(PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))[0]
    assert out.outputs[0].logprobs is None and out.outputs[0].cumulative_logprob is None
    assert out.snapshot().outputs[0].cumulative_logprob is None
    assert out.to_dict()["outputs"][0]["cumulative_logprob"] is None


def test_detokenize_false_gives_the_same_tokens_without_text(llm, reference_tokens):
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, detokenize=False, logprobs=2)
    outs = llm.generate(PROMPTS, params)
    assert [o.outputs[0].token_ids for o in outs] == reference_tokens
    assert all(o.outputs[0].text == "" and o.outputs[0].finish_reason == "length" for o in outs)
    assert all(lp.decoded_token is None for d in outs[0].outputs[0].logprobs for lp in d.values())
    with pytest.raises(SamplingParamsError) as e:
        SamplingParams(stop=["x"], detokenize=False)
    assert (e.value.path, e.value.value, e.value.allowed) == (
        ("stop",),
        ["x"],
        "none when detokenize is False: stop strings match text",
    )


def test_step_outputs_share_the_growing_token_list_and_snapshot_freezes_it(llm, reference_tokens):
    engine = llm.engine
    engine.add_request(PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, logprobs=1))
    first = engine.step()[0]
    frozen = first.snapshot()
    while engine.has_unfinished_requests():
        last = engine.step()[-1]
    assert frozen.outputs[0].token_ids == reference_tokens[0][:1] and len(frozen.outputs[0].logprobs) == 1
    assert first.outputs[0].token_ids == last.outputs[0].token_ids == reference_tokens[0][:3]  # no per-step copy
    assert first.outputs[0].num_new_tokens == 1 and not first.finished and last.finished


def test_text_equals_decoding_the_tokens(llm):
    out = llm.generate(PROMPTS[2], GREEDY)[0].outputs[0]
    assert out.text == llm.tokenizer.decode(out.token_ids, skip_special_tokens=True)


@pytest.mark.parametrize(
    "kwargs, name, value, allowed",
    [
        ({"max_tokens": 0}, "max_tokens", 0, "integer >= 1"),
        ({"top_p": 0.0}, "top_p", 0.0, "number in (0, 1]"),
        ({"top_p": 1.5}, "top_p", 1.5, "number in (0, 1]"),
        ({"temperature": -1}, "temperature", -1, "finite number >= 0"),
        ({"temperature": float("inf")}, "temperature", float("inf"), "finite number >= 0"),
        ({"top_k": 1.5}, "top_k", 1.5, "0 or -1 (all), or integer >= 1"),
        ({"top_k": True}, "top_k", True, "0 or -1 (all), or integer >= 1"),
        ({"max_tokens": 2.5}, "max_tokens", 2.5, "integer >= 1"),
        # every seed's range, in every seed's words (was "integer in [-2**63, 2**63 - n] (completion i uses seed + i, a
        # 64-bit seed), or None", while LLM(seed=) and --seed took [0, 2**64 - 1] and the server [-2^63, 2^63 - n])
        ({"seed": "x"}, "seed", "x", "integer in [-2^63, 2^63 - 1], or None"),
        ({"seed": 2**63}, "seed", 9223372036854775808, "integer in [-2^63, 2^63 - 1], or None"),
        ({"seed": 2**64}, "seed", 18446744073709551616, "integer in [-2^63, 2^63 - 1], or None"),
        ({"seed": -(2**63) - 1}, "seed", -9223372036854775809, "integer in [-2^63, 2^63 - 1], or None"),
        ({"logprobs": -1}, "logprobs", -1, "integer >= 0"),  # the upper limit is the engine's (--max-logprobs)
        # a list's first bad item (was the whole list: "stop_token_ids [2, -1] not allowed", "stop ['a', 5] ...")
        # the item's index in the path (a fresh user's finding: stop_token_ids=[True] named no index)
        ({"stop_token_ids": [2, -1]}, ("stop_token_ids", 1), -1, "token ids (integers >= 0)"),
        ({"stop_token_ids": [2.0]}, ("stop_token_ids", 0), 2.0, "token ids (integers >= 0)"),
        ({"stop_token_ids": [True]}, ("stop_token_ids", 0), True, "token ids (integers >= 0)"),
        ({"stop_token_ids": 2}, "stop_token_ids", 2, "a list of token ids, or None"),
        ({"stop": 5}, "stop", 5, "a string, a list of strings, or None"),
        ({"stop": ["a", 5]}, ("stop", 1), 5, "non-empty strings"),
        ({"stop": ""}, ("stop", 0), "", "non-empty strings"),
    ],
)
def test_bad_sampling_params(kwargs, name, value, allowed):
    with pytest.raises(SamplingParamsError) as e:
        SamplingParams(**kwargs)
    path = name if isinstance(name, tuple) else (name,)
    assert (e.value.path, e.value.value, e.value.allowed) == (path, value, allowed)
    assert type(e.value.value) is type(value)  # 2.0 is not 2, True not 1


def test_bad_sampling_params_golden_line():
    with pytest.raises(SamplingParamsError) as e:
        SamplingParams(stop=["a", 5])
    assert (str(e.value), e.value.index) == ("stop[1] 5 not allowed (allowed: non-empty strings)", 1)


def test_every_seed_in_the_range_works_with_every_n(llm):
    """Completion i of n uses seed + i, wrapped as 64-bit integers wrap: seed 2^63 - 1 with n = 2 (was refused: "2^63 -
    n") gives completion 1 the seed -2^63, the seed torch reads for 2^63 (as vLLM's seed + 1 would give it)."""
    params = dict(temperature=1.0, max_tokens=8, ignore_eos=True)
    (pair,) = llm.generate(PROMPTS[0], SamplingParams(n=2, seed=2**63 - 1, **params))
    (last,) = llm.generate(PROMPTS[0], SamplingParams(seed=-(2**63), **params))
    (first,) = llm.generate(PROMPTS[0], SamplingParams(seed=2**63 - 1, **params))
    assert [c.token_ids for c in pair.outputs] == [first.outputs[0].token_ids, last.outputs[0].token_ids]


def test_the_engine_seed_takes_the_same_range(llama_dir):
    """LLM(seed=), --seed: the range of every seed (was [0, 2**64 - 1]); a negative one seeds torch's generators as
    they read it, and the benchmarks' numpy generator by its 64 bits."""
    from attnserve.benchmarks.requests import random_requests

    with pytest.raises(ValueError) as e:
        LLM(llama_dir, device="cpu", seed=2**63)
    assert (e.value.key, e.value.value, e.value.allowed) == ("seed", 2**63, "integer in [-2^63, 2^63 - 1]")
    llm = LLM(llama_dir, device="cpu", seed=-(2**63), kv_cache_memory=8 << 20)
    (out,) = llm.generate(PROMPTS[0], SamplingParams(temperature=1.0, max_tokens=4, ignore_eos=True))
    assert len(out.outputs[0].token_ids) == 4
    assert random_requests(2, 4, 2, 0.0, 100, -1) == random_requests(2, 4, 2, 0.0, 100, 2**64 - 1)


def test_sampling_params_error_carries_name_value_and_allowed():
    """For a caller whose line names the parameter already (the CLI's ``argument --stop:``, the server's
    ``stop.1:``): the parameter, the item refused and its index, the allowed values, the message without the name."""
    with pytest.raises(SamplingParamsError) as e:
        SamplingParams(stop=["a", ""])
    assert (e.value.name, e.value.value, e.value.index, e.value.allowed) == ("stop", "", 1, "non-empty strings")
    assert (e.value.path, e.value.value, e.value.allowed) == (("stop", 1), "", "non-empty strings")
    with pytest.raises(SamplingParamsError) as e:
        SamplingParams(max_tokens=0)
    assert (e.value.name, e.value.value, e.value.index) == ("max_tokens", 0, None)


def test_none_stop_and_stop_token_ids_mean_none_as_in_vllm():
    params = SamplingParams(stop=None, stop_token_ids=None)
    assert params.stop == [] and params.stop_token_ids == []
    assert SamplingParams(stop="x", stop_token_ids=(3,)).stop_token_ids == [3]


def test_prompt_longer_than_max_model_len(llama_dir):
    llm = LLM(llama_dir, dtype="float32", device="cpu", max_model_len=16, kv_cache_memory=8 << 20)
    with pytest.raises(ValueError) as e:
        llm.generate([PROMPTS[0], PROMPTS[1]], GREEDY)
    # the server's words (OpenAI's), naming the batch's prompt (was "prompt has 37 tokens; max_model_len is 16, ...")
    assert str(e.value) == (
        "This model's maximum context length is 16 tokens. However, prompts[1] has 37 tokens, which "
        "leaves no room for the completion (at most 15 prompt tokens fit). Please raise max_model_len "
        "or reduce the length of the prompt."
    )
    assert not llm.engine.has_unfinished_requests()  # nothing was queued


# each bad token id by its position in the batch (was "token id 1000000 not allowed (...)", no position)
@pytest.mark.parametrize(
    "prompt, path, bad",
    [([5, 10**6], ("prompts", 1, 1), 10**6), ([-1, 5], ("prompts", 1, 0), -1), ([1, "2"], ("prompts", 1, 1), "2")],
)
def test_token_ids_outside_the_vocabulary_are_refused_up_front(llm, prompt, path, bad):
    vocab = llm.engine.hf_config.vocab_size
    with pytest.raises(ValueError) as e:
        llm.generate([PROMPTS[0], prompt], GREEDY)
    assert (e.value.path, e.value.value, e.value.allowed) == (
        path,
        bad,
        f"integer in [0, {vocab}), the vocabulary size",
    )
    assert not llm.engine.has_unfinished_requests()


def test_stop_token_ids_outside_the_vocabulary_are_refused_up_front(llm):
    """LLMEngine.check_params, which the server calls too: the first bad id, its index and the vocabulary's range
    (was accepted, a stop token that can never be sampled)."""
    vocab = llm.engine.vocab_size
    with pytest.raises(SamplingParamsError) as e:
        llm.generate(PROMPTS[:2], [GREEDY, SamplingParams(max_tokens=2, stop_token_ids=[2, vocab, vocab + 1])])
    assert (e.value.name, e.value.value, e.value.index) == ("stop_token_ids", vocab, 1)
    assert e.value.allowed == f"integer in [0, {vocab}), the vocabulary size"
    assert isinstance(e.value, ValueError) and not llm.engine.has_unfinished_requests()  # nothing was queued
    with pytest.raises(SamplingParamsError):  # add_request checks too
        llm.engine.add_request(PROMPTS[0], SamplingParams(stop_token_ids=[10**9]))
    assert not llm.engine.has_unfinished_requests()
    llm.engine.check_params(SamplingParams(stop_token_ids=[0, vocab - 1]))  # the ends of the range


def test_a_failed_step_leaves_no_request_behind(llm, reference_tokens, monkeypatch):
    calls = []

    def broken_step():
        calls.append(1)
        raise RuntimeError("step failed")

    monkeypatch.setattr(llm.engine, "step", broken_step)
    with pytest.raises(RuntimeError, match="step failed"):
        llm.generate(PROMPTS, GREEDY)
    monkeypatch.undo()
    assert calls == [1] and not llm.engine.has_unfinished_requests()
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)] == reference_tokens  # usable again


def test_max_model_len_beyond_the_model_is_refused(llama_dir):
    from transformers import AutoConfig

    limit = AutoConfig.from_pretrained(llama_dir).max_position_embeddings
    with pytest.raises(ValueError) as e:
        LLM(llama_dir, dtype="float32", device="cpu", max_model_len=limit + 1, kv_cache_memory=8 << 20)
    assert (e.value.key, e.value.value, e.value.allowed) == (
        "max_model_len",
        limit + 1,
        f"at most the model's max_position_embeddings, {limit}",
    )


def test_generation_stops_at_max_model_len(llama_dir):
    """max_tokens None: the rest of the context (a max_tokens beyond it is refused, as the server refuses it)."""
    llm = LLM(llama_dir, dtype="float32", device="cpu", max_model_len=12, kv_cache_memory=8 << 20)
    out = llm.generate(PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True))[0].outputs[0]
    assert len(out.token_ids) == 12 - len(PROMPTS[0]) and out.finish_reason == "length"
    # the engine itself still ends a request at max_model_len, whatever its max_tokens
    llm.engine.add_request(PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=100, ignore_eos=True))
    final = [o for _ in range(20) for o in llm.engine.step() if o.finished]
    assert len(final[0].outputs[0].token_ids) == 12 - len(PROMPTS[0]) and final[0].outputs[0].finish_reason == "length"


def test_unknown_model_path():
    with pytest.raises(FileNotFoundError) as e:
        LLM("/no/such/model")
    assert (
        str(e.value)
        == "model '/no/such/model' not found: give a folder with config.json and safetensors, a .gguf file, or a Hugging Face Hub id (org/name)"
    )


def test_a_model_or_tokenizer_path_that_is_another_file(tmp_path):
    """A file that is there but no .gguf (a config.json, a prompts file) is named as such, not "not found"."""
    other = tmp_path / "config.json"
    other.write_text("{}")
    with pytest.raises(FileNotFoundError) as e:
        LLM(str(other))
    assert str(e.value).startswith(f"model {str(other)!r} is a file, not a .gguf file: give a folder")
    from attnserve.model_executor.loader import resolve_tokenizer_source

    with pytest.raises(FileNotFoundError) as e:
        resolve_tokenizer_source(str(other))
    assert str(e.value).startswith(f"tokenizer {str(other)!r} is a file, not a .gguf file: give a folder")


def test_unsupported_architecture(tmp_path, llama_dir):
    import shutil

    shutil.copytree(llama_dir, tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    cfg["architectures"] = ["FalconForCausalLM"]
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError) as e:
        LLM(str(tmp_path / "m"), device="cpu")
    assert "model architecture ['FalconForCausalLM'] not supported (supported: " in str(e.value)


def test_sharded_safetensors_and_dummy_weights(tmp_path, llama_dir, reference_tokens):
    import shutil

    from transformers import AutoModelForCausalLM

    sharded = tmp_path / "sharded"
    AutoModelForCausalLM.from_pretrained(llama_dir).save_pretrained(sharded, max_shard_size="2MB")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(f"{llama_dir}/{f}", sharded / f)
    assert len(list(sharded.glob("*.safetensors"))) > 1 and (sharded / "model.safetensors.index.json").exists()
    llm = LLM(str(sharded), dtype="float32", device="cpu", block_size=4, kv_cache_memory=8 << 20)
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)] == reference_tokens
    dummy = LLM(llama_dir, dtype="float32", device="cpu", load_format="dummy", kv_cache_memory=8 << 20)
    out = dummy.generate(PROMPTS[0], GREEDY)[0].outputs[0]
    assert len(out.token_ids) == 20 and out.token_ids != reference_tokens[0]


def test_abort_frees_the_requests_blocks(llm):
    engine = llm.engine
    free = engine.block_manager.num_free_blocks
    rid = engine.add_request(PROMPTS[1], SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True))
    engine.step()
    assert engine.block_manager.num_free_blocks < free
    engine.abort_request(rid)
    assert engine.block_manager.num_free_blocks == free and not engine.has_unfinished_requests()


@pytest.mark.parametrize("stop", [None, ["never seen"]])
def test_abort_returns_the_final_output_with_finish_reason_abort(llm, stop):
    """The text so far (held-back stop-string prefix included) and the tokens so far; then the id is unknown."""
    engine = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True, stop=stop, n=2)
    rid = engine.add_request(PROMPTS[1], params)
    for _ in range(4):
        engine.step()
    out = engine.abort_request(rid)
    assert out.finished and len(out.outputs) == 2
    for c in out.outputs:
        assert c.finish_reason == "abort" and c.stop_reason is None
        assert 0 < len(c.token_ids) < 50
        assert c.text == llm.tokenizer.decode(c.token_ids, skip_special_tokens=True)
    assert engine.abort_request(rid) is None and engine.abort_request("unknown") is None


@pytest.mark.parametrize("requested", [True, None, False])
def test_use_skinny_gemm_on_cpu_says_it_does_nothing_when_asked_for(llama_dir, caplog, requested):
    """Explicit True warns that it has no effect here; unset (on where it applies) and False say nothing."""
    with caplog.at_level("WARNING", logger="attnserve.gemv"):
        llm = LLM(
            llama_dir,
            dtype="float32",
            device="cpu",
            max_model_len=16,
            kv_cache_memory=8 << 20,
            **({} if requested is None else {"use_skinny_gemm": requested}),
        )
    warned = [r.getMessage() for r in caplog.records if r.name == "attnserve.gemv" and r.levelname == "WARNING"]
    assert warned == (
        [
            "use_skinny_gemm has no effect here: the Triton GEMV runs in CUDA-graph decode steps only (this engine: no CUDA)"
        ]
        if requested
        else []
    )
    assert llm.engine.config.use_skinny_gemm is requested and llm.engine.runner.gemv_plan is None


def test_a_kv_cache_smaller_than_max_model_len_warns_of_both_limits(llama_dir, caplog):
    """3 blocks of 4 tokens: the warning names the 12-token limit for requests and for prompts, and both hold."""
    with caplog.at_level(logging.WARNING):
        small = LLM(llama_dir, dtype="float32", device="cpu", block_size=4, num_gpu_blocks=3)
    assert (
        "a request ends (finish_reason length) when it reaches 12 tokens, and a prompt of 12 tokens or more is refused"
    ) in caplog.text
    with pytest.raises(ValueError) as e:
        small.engine.add_request(list(range(100, 112)), GREEDY)
    assert str(e.value) == KV_REFUSAL and e.value.key == "num_gpu_blocks"
    small.engine.add_request(list(range(100, 111)), GREEDY)  # 11 tokens + the one it generates fit


KV_REFUSAL = (
    "prompt of 12 tokens needs 4 KV blocks (13 tokens with the one it generates), the KV cache has 3 "
    "(12 tokens), so at most 11 prompt tokens fit; raise num_gpu_blocks"
)


def test_a_prompt_the_kv_cache_cannot_hold_is_refused_before_any_prompt_is_queued(llama_dir):
    """check_prompt refuses it (the scheduler's keyed error), so LLM.generate raises before it queues the prompts
    before it (one used to stay queued, half added); the engine then runs the next call normally."""
    small = LLM(llama_dir, dtype="float32", device="cpu", block_size=4, num_gpu_blocks=3)
    with pytest.raises(ValueError) as e:
        small.engine.check_prompt(list(range(100, 112)))
    assert str(e.value) == KV_REFUSAL and e.value.key == "num_gpu_blocks"
    with pytest.raises(ValueError) as e:
        small.generate([PROMPTS[0], list(range(100, 112))], GREEDY)
    assert str(e.value) == KV_REFUSAL
    assert not small.engine.has_unfinished_requests() and small.engine.output_processor.parents == {}
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    (out,) = small.generate([PROMPTS[0]], params)
    assert len(out.outputs[0].token_ids) == 3 and out.outputs[0].finish_reason == "length"


def test_text_with_a_lone_surrogate_is_refused_before_the_tokenizer(llm):
    """``"hi\\ud800"`` has no UTF-8 form; the tokenizer's TypeError was what a caller saw (a fresh-user trial)."""
    with pytest.raises(ValueError) as e:
        llm.generate(["hi\ud800"], SamplingParams(max_tokens=1))
    assert str(e.value) == "prompts[0] 'hi\\ud800' holds a lone surrogate '\\ud800' at index 2 (allowed: Unicode text)"


def test_final_only_request_gives_one_output_equal_to_the_last_streamed_one(llm):
    """LLM.generate's requests (final_only): step() returns their output only when they finish."""
    engine = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, n=2, stop=["zz"])
    streamed = engine.add_request(PROMPTS[0], params)
    final = engine.add_request(PROMPTS[0], params, final_only=True)
    seen: dict[str, list] = {streamed: [], final: []}
    while engine.has_unfinished_requests():
        for out in engine.step():
            seen[out.request_id].append(out)
    assert len(seen[streamed]) > 1 and [o.finished for o in seen[final]] == [True]
    last, only = seen[streamed][-1], seen[final][0]
    assert [(c.text, c.token_ids, c.finish_reason) for c in only.outputs] == [
        (c.text, c.token_ids, c.finish_reason) for c in last.outputs
    ]
    assert only.metrics.first_token_time is not None and only.metrics.finished_time is not None
