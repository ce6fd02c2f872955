"""vLLM's sampling fields through LLM.generate: penalties, logit_bias, min_tokens, bad_words, allowed_token_ids,
prompt_logprobs, include_stop_str_in_output, skip_special_tokens, truncate_prompt_tokens. Default model (CPU,
float32) and a tiny random Llama (against transformers; async scheduling with preemption and chunked prefill)."""

from __future__ import annotations

import pytest
import torch

from attnserve import LLM, SamplingParams

PROMPT = "The capital of France is"
GREEDY = dict(temperature=0, max_tokens=12)


def _text(llm, prompt=PROMPT, **kw):
    return llm.generate([prompt], SamplingParams(**(GREEDY | kw)))[0].outputs[0]


def test_a_mixed_batch_gives_each_request_its_tokens_alone(default_llm):
    prompts = [PROMPT, "def fibonacci(n):", "Once upon a time, there", "The capital of France is"]
    params = [
        SamplingParams(**GREEDY, repetition_penalty=1.3, frequency_penalty=0.4),
        SamplingParams(**GREEDY),
        SamplingParams(**GREEDY, presence_penalty=1.5, logit_bias={260: 2.0}, min_tokens=12),
        SamplingParams(**GREEDY, bad_words=[" Paris"]),
    ]
    together = default_llm.generate(prompts, params)
    for p, sp, out in zip(prompts, params, together):
        assert out.outputs[0].token_ids == default_llm.generate([p], sp)[0].outputs[0].token_ids
    plain = _text(default_llm)
    assert together[0].outputs[0].token_ids != plain.token_ids  # each rule changed the output
    assert together[3].outputs[0].token_ids != plain.token_ids


def test_min_tokens_holds_back_eos_and_stop_strings(default_llm):
    chat = [{"role": "user", "content": "Answer yes or no: is the sky blue?"}]
    short = default_llm.chat(chat, SamplingParams(temperature=0, max_tokens=60))[0].outputs[0]
    assert short.finish_reason == "stop" and short.stop_reason is None  # EOS
    n = len(short.token_ids)
    longer = default_llm.chat(chat, SamplingParams(temperature=0, max_tokens=60, min_tokens=n + 5))[0].outputs[0]
    assert len(longer.token_ids) >= n + 5 and longer.token_ids[: n - 1] == short.token_ids[: n - 1]
    assert default_llm.tokenizer.eos_token_id not in longer.token_ids[: n + 5]
    # a stop string is not matched before min_tokens tokens
    text = _text(default_llm).text  # ' Paris.\n\nThe answer is: 201'
    assert text.startswith(" Paris")
    assert _text(default_llm, stop=["Paris"]).text == " "
    assert _text(default_llm, stop=["Paris"], min_tokens=3).text.startswith(" Paris")
    # tokens ' Paris', '.', '\n', '\n', 'The', ' answer': past min_tokens 5 the first match ends in ' answer', and
    # the text is cut there, not at the 'e' of 'The' written inside min_tokens (streamed or not, as in vLLM)
    assert text.startswith(" Paris.\n\nThe answer")
    params = SamplingParams(**GREEDY, stop=["e"], min_tokens=5)
    out = default_llm.generate([PROMPT], params)[0].outputs[0]
    assert (out.text, out.stop_reason, len(out.token_ids)) == (" Paris.\n\nThe answ", "e", 6)
    default_llm.engine.add_request(PROMPT, params)
    deltas = [o.outputs[0].text_delta for _ in range(12) for o in default_llm.engine.step()]
    assert "".join(deltas) == out.text


def test_bad_words_allowed_token_ids_and_logit_bias(default_llm):
    tok = default_llm.tokenizer
    plain = _text(default_llm)
    assert " Paris" in plain.text
    banned = _text(default_llm, bad_words=["Paris"])  # both " Paris" and "Paris"
    assert "Paris" not in banned.text
    two = tok.encode("The answer", add_special_tokens=False)
    assert len(two) == 2 and two[0] in plain.token_ids
    out = _text(default_llm, bad_words=["The answer"]).token_ids
    assert all(out[i : i + 2] != two for i in range(len(out)))
    allowed = [tok.encode(w, add_special_tokens=False)[0] for w in (" yes", " no", " maybe")]
    assert set(_text(default_llm, allowed_token_ids=allowed).token_ids) <= set(allowed)
    biased = _text(default_llm, logit_bias={allowed[2]: 100.0})
    assert biased.token_ids == [allowed[2]] * 12


def test_include_stop_str_in_output(default_llm):
    without = _text(default_llm, stop=["answer"])
    with_it = _text(default_llm, stop=["answer"], include_stop_str_in_output=True)
    assert with_it.text == without.text + "answer" and with_it.stop_reason == "answer"
    # a stop token id is left out of the text (vLLM), and kept with include_stop_str_in_output
    tid = _text(default_llm).token_ids[1]
    piece = default_llm.tokenizer.decode([tid])
    assert not _text(default_llm, stop_token_ids=[tid]).text.endswith(piece)
    assert _text(default_llm, stop_token_ids=[tid], include_stop_str_in_output=True).text.endswith(piece)


def test_skip_special_tokens(default_llm):
    tok = default_llm.tokenizer
    special = tok.convert_tokens_to_ids("<|im_start|>")
    kw = dict(logit_bias={special: 100.0}, max_tokens=3)
    assert _text(default_llm, **kw).text == ""
    assert _text(default_llm, skip_special_tokens=False, **kw).text == "<|im_start|>" * 3


def test_truncate_prompt_tokens(default_llm):
    ids = default_llm.tokenizer.encode("A long prompt: one two three four five six seven eight")
    out = default_llm.generate([ids], SamplingParams(**GREEDY, truncate_prompt_tokens=4))[0]
    assert out.prompt_token_ids == ids[-4:]
    assert (
        out.outputs[0].token_ids == default_llm.generate([ids[-4:]], SamplingParams(**GREEDY))[0].outputs[0].token_ids
    )
    full = default_llm.generate([ids], SamplingParams(**GREEDY, truncate_prompt_tokens=-1))[0]
    assert full.prompt_token_ids == ids  # -1: max_model_len, longer than the prompt


def test_truncate_prompt_tokens_over_max_model_len_is_refused(default_llm):
    """As vLLM: a truncation longer than any prompt the engine takes is refused (was: taken as no truncation)."""
    from attnserve.core.sampling_params import SamplingParamsError

    longest = default_llm.engine.checks.max_model_len
    with pytest.raises(SamplingParamsError) as e:
        default_llm.generate(["Hi"], SamplingParams(**GREEDY, truncate_prompt_tokens=longest + 1))
    assert (e.value.name, e.value.refusal.value) == ("truncate_prompt_tokens", longest + 1)
    assert not default_llm.engine.has_unfinished_requests()
    out = default_llm.generate(["Hi"], SamplingParams(**GREEDY, truncate_prompt_tokens=longest))[0]
    assert out.prompt_token_ids == default_llm.tokenizer.encode("Hi")


@pytest.mark.parametrize(
    "bad, name",
    [
        (dict(presence_penalty=2.5), "presence_penalty"),
        (dict(frequency_penalty=-3), "frequency_penalty"),
        (dict(repetition_penalty=0), "repetition_penalty"),
        (dict(min_tokens=20, max_tokens=10), "min_tokens"),
        (dict(allowed_token_ids=[]), "allowed_token_ids"),
        (dict(prompt_logprobs=-1), "prompt_logprobs"),
        (dict(truncate_prompt_tokens=0), "truncate_prompt_tokens"),
        (dict(logit_bias={"a": 1.0}), "logit_bias"),
        # a max_tokens of the wrong type is named, not a TypeError from the min_tokens comparison
        (dict(max_tokens="5"), "max_tokens"),
        (dict(max_tokens=[1], min_tokens=1), "max_tokens"),
        # on/off options take a bool: "false" is truthy and would switch the option on
        (dict(ignore_eos="false"), "ignore_eos"),
        (dict(include_stop_str_in_output=1), "include_stop_str_in_output"),
        (dict(skip_special_tokens=None), "skip_special_tokens"),
        (dict(spaces_between_special_tokens="no"), "spaces_between_special_tokens"),
        (dict(detokenize=0), "detokenize"),
    ],
)
def test_bad_values_are_refused(bad, name):
    from attnserve.core.sampling_params import _BOOL_FIELDS, SamplingParamsError

    with pytest.raises(SamplingParamsError) as e:
        SamplingParams(**bad)
    assert e.value.name == name
    if name in ("max_tokens", *_BOOL_FIELDS):  # the value refused is the one given
        assert e.value.refusal.value == bad[name]


def test_fields_changed_after_construction_take_effect(default_llm):
    """vLLM code sets fields on a built SamplingParams: the engine reads them (``SamplingParams.snapshot``)."""
    changed = SamplingParams(**GREEDY)
    changed.presence_penalty = 1.5
    built = SamplingParams(**GREEDY, presence_penalty=1.5)
    out = default_llm.generate([PROMPT], changed)[0].outputs[0].token_ids
    assert out == default_llm.generate([PROMPT], built)[0].outputs[0].token_ids
    assert out != _text(default_llm).token_ids
    first = _text(default_llm, max_tokens=1).token_ids[0]
    sp = SamplingParams(temperature=0, max_tokens=1)
    sp.logit_bias = {first: -100.0}
    assert default_llm.generate([PROMPT], sp)[0].outputs[0].token_ids[0] != first
    sp.bad_words, sp.logit_bias = [" Paris"], None  # tokenized again, not the last request's words
    assert default_llm.generate([PROMPT], sp)[0].outputs[0].token_ids[0] != first


@pytest.mark.parametrize(
    "name, value", [("n", 0), ("temperature", float("nan")), ("max_tokens", -5), ("seed", 2**70), ("top_p", 2.0)]
)
def test_fields_changed_after_construction_are_checked_before_any_prompt_is_queued(default_llm, name, value):
    from attnserve.core.sampling_params import SamplingParamsError

    good, bad = SamplingParams(temperature=0, max_tokens=2), SamplingParams(temperature=0, max_tokens=2)
    setattr(bad, name, value)
    with pytest.raises(SamplingParamsError) as e:
        default_llm.generate([PROMPT, PROMPT], [good, bad])
    assert e.value.name == name
    assert not default_llm.engine.has_unfinished_requests()


def test_token_ids_outside_the_vocabulary_are_refused(default_llm):
    from attnserve.core.sampling_params import SamplingParamsError

    for kw, name in (
        (dict(allowed_token_ids=[1, 10**6]), "allowed_token_ids"),
        (dict(logit_bias={10**6: 1.0}), "logit_bias"),
    ):
        with pytest.raises(SamplingParamsError) as e:
            default_llm.generate([PROMPT], SamplingParams(**kw))
        assert e.value.name == name


# --- a tiny random Llama: transformers' references, async scheduling ------------------------------------
@pytest.fixture(scope="module")
def llama_dir(tiny_model_dir):
    return tiny_model_dir("llama")


@pytest.fixture(scope="module")
def hf_llama(llama_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(llama_dir, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    return model


@pytest.fixture(scope="module")
def tiny_llms(llama_dir):
    """(sync, async) engines with a small KV cache (preemption) and 5-token steps (chunked prefill)."""
    args = dict(dtype="float32", device="cpu", block_size=4, kv_cache_memory=2 << 20, max_num_batched_tokens=5)
    return LLM(llama_dir, async_scheduling=False, **args), LLM(llama_dir, async_scheduling=True, **args)


TINY_PROMPTS = [[5, 6, 7, 8, 9, 10, 11], list(range(100, 137)), [42, 42, 43], list(range(300, 318))]


def test_repetition_penalty_equals_transformers_generate(tiny_llms, hf_llama):
    llm = tiny_llms[0]
    for prompt in TINY_PROMPTS[:2]:
        hf = hf_llama.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False, repetition_penalty=1.8)
        out = llm.generate(
            [prompt], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, repetition_penalty=1.8)
        )[0]
        assert out.outputs[0].token_ids == hf[0, len(prompt) :].tolist()


def test_async_scheduling_preemption_and_chunks_give_the_sync_tokens(tiny_llms):
    sync, asyn = tiny_llms
    params = [
        SamplingParams(
            temperature=0,
            max_tokens=40,
            ignore_eos=True,
            presence_penalty=0.8,
            frequency_penalty=0.3,
            repetition_penalty=1.2,
        ),
        SamplingParams(temperature=0, max_tokens=40, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=40, min_tokens=30, logit_bias={7: 1.5}),
        SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, repetition_penalty=1.5, n=2),
    ]
    a = [[c.token_ids for c in o.outputs] for o in sync.generate(TINY_PROMPTS, params)]
    b = [[c.token_ids for c in o.outputs] for o in asyn.generate(TINY_PROMPTS, params)]
    assert a == b
    assert sync.engine.scheduler.requests == {}
    alone = [sync.generate([p], sp)[0].outputs[0].token_ids for p, sp in zip(TINY_PROMPTS, params)]
    assert [x[0] for x in a] == alone


def test_multi_token_bad_words_with_async_scheduling(tiny_llms):
    sync, asyn = tiny_llms
    plain = sync.generate([TINY_PROMPTS[0]], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))[0]
    toks = plain.outputs[0].token_ids
    ids = toks[4:7]  # three generated tokens (a random model's text need not tokenize back to them)
    sp = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, bad_words=["w"], bad_words_token_ids=[ids])
    outs = [llm.generate([TINY_PROMPTS[0]], sp)[0].outputs[0].token_ids for llm in tiny_llms]
    assert outs[0] == outs[1] != toks
    assert all(outs[0][i : i + len(ids)] != ids for i in range(len(outs[0])))


def test_prompt_logprobs_equal_transformers_log_softmax(tiny_llms, hf_llama):
    prompt = TINY_PROMPTS[1]  # 37 tokens over 5-token steps: chunk boundaries inside the prompt
    with torch.no_grad():
        ref = torch.log_softmax(hf_llama(torch.tensor([prompt])).logits[0].float(), dim=-1)
    for llm in tiny_llms:
        out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=3))[0]
        lps = out.prompt_logprobs
        assert len(lps) == len(prompt) and lps[0] is None
        for pos, (tid, d) in enumerate(zip(prompt[1:], lps[1:])):
            row = ref[pos]
            assert tid in d and abs(d[tid].logprob - row[tid].item()) < 1e-4
            assert d[tid].rank == int((row > row[tid]).sum()) + 1
            top = row.topk(3).indices.tolist()
            assert set(top) <= set(d) and len(d) == 3 + (tid not in top)
            assert all(abs(d[t].logprob - row[t].item()) < 1e-4 for t in top)
