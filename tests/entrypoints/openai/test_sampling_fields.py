"""vLLM's sampling fields through the official openai client against the real server: each changes the output
as vLLM's does (penalties, logit_bias, min_tokens, bad_words, allowed_token_ids, prompt_logprobs,
include_stop_str_in_output, skip_special_tokens, truncate_prompt_tokens), and bad values are 400s naming them."""

from __future__ import annotations

import openai
import pytest

PROMPT = "The capital of France is"
GREEDY = dict(temperature=0, max_tokens=12)


def _complete(client, model_name, extra=None, **kw):
    return client.completions.create(model=model_name, prompt=PROMPT, **(GREEDY | kw), extra_body=extra)


@pytest.fixture(scope="module")
def plain(client, model_name):
    return _complete(client, model_name)


def _ids(tok, r) -> list[int]:
    return tok.encode(r.choices[0].text, add_special_tokens=False)


@pytest.mark.parametrize(
    "kw, extra",
    [
        (dict(presence_penalty=2.0), None),
        (dict(frequency_penalty=2.0), None),
        ({}, dict(repetition_penalty=1.8)),
    ],
)
def test_penalties_change_the_output(client, model_name, plain, kw, extra):
    assert _complete(client, model_name, extra, **kw).choices[0].text != plain.choices[0].text


def test_penalties_equal_the_engine_s(client, model_name, default_llm):
    from attnserve import SamplingParams

    fields = dict(presence_penalty=0.5, frequency_penalty=0.7)
    r = _complete(client, model_name, dict(repetition_penalty=1.3), **fields)
    ref = default_llm.generate([PROMPT], SamplingParams(**GREEDY, **fields, repetition_penalty=1.3))[0]
    assert r.choices[0].text == ref.outputs[0].text


def test_logit_bias_allowed_token_ids_and_bad_words(client, model_name, plain, default_tokenizer):
    tok = default_tokenizer
    yes = tok.encode(" yes", add_special_tokens=False)[0]
    r = _complete(client, model_name, logit_bias={str(yes): 100})
    assert r.choices[0].text == " yes" * 12
    allowed = [tok.encode(w, add_special_tokens=False)[0] for w in (" yes", " no")]
    r = _complete(client, model_name, dict(allowed_token_ids=allowed))
    assert set(r.choices[0].text.split()) <= {"yes", "no"}
    assert " Paris" in plain.choices[0].text
    r = _complete(client, model_name, dict(bad_words=["Paris"]))
    assert "Paris" not in r.choices[0].text and r.choices[0].text != plain.choices[0].text


def test_min_tokens_and_stop_strings(client, model_name, plain):
    assert plain.choices[0].text.startswith(" Paris.")
    assert _complete(client, model_name, stop=["Paris"]).choices[0].text == " "
    held = _complete(client, model_name, dict(min_tokens=3), stop=["Paris"])
    assert held.choices[0].text.startswith(" Paris")
    kept = _complete(client, model_name, dict(include_stop_str_in_output=True), stop=["answer"])
    assert kept.choices[0].text == _complete(client, model_name, stop=["answer"]).choices[0].text + "answer"
    chat = [{"role": "user", "content": "Answer yes or no: is the sky blue?"}]
    short = client.chat.completions.create(model=model_name, messages=chat, temperature=0, max_tokens=60)
    n = short.usage.completion_tokens
    assert short.choices[0].finish_reason == "stop" and n < 50
    longer = client.chat.completions.create(
        model=model_name, messages=chat, temperature=0, max_tokens=60, extra_body=dict(min_tokens=n + 5)
    )
    assert longer.usage.completion_tokens >= n + 5


def test_skip_special_tokens(client, model_name, default_tokenizer):
    special = default_tokenizer.convert_tokens_to_ids("<|im_start|>")
    kw = dict(logit_bias={str(special): 100}, max_tokens=2)
    assert _complete(client, model_name, **kw).choices[0].text == ""
    assert _complete(client, model_name, dict(skip_special_tokens=False), **kw).choices[0].text == "<|im_start|>" * 2


def test_truncate_prompt_tokens(client, model_name, default_tokenizer):
    ids = default_tokenizer.encode("one two three four five six seven eight nine ten " * 3)
    r = client.completions.create(model=model_name, prompt=ids, **GREEDY, extra_body=dict(truncate_prompt_tokens=5))
    assert r.usage.prompt_tokens == 5
    assert r.choices[0].text == client.completions.create(model=model_name, prompt=ids[-5:], **GREEDY).choices[0].text


def test_prompt_logprobs(client, model_name, default_llm, default_tokenizer):
    from attnserve import SamplingParams

    ids = default_tokenizer.encode(PROMPT)
    r = _complete(client, model_name, dict(prompt_logprobs=2), max_tokens=1)
    lps = r.choices[0].model_extra["prompt_logprobs"]
    ref = default_llm.generate([PROMPT], SamplingParams(max_tokens=1, prompt_logprobs=2))[0].prompt_logprobs
    assert len(lps) == len(ids) and lps[0] is None
    for tid, got, want in zip(ids[1:], lps[1:], ref[1:]):
        assert str(tid) in got and set(got) == {str(t) for t in want}
        for t, lp in want.items():
            assert abs(got[str(t)]["logprob"] - lp.logprob) < 1e-3 and got[str(t)]["rank"] == lp.rank
            assert got[str(t)]["decoded_token"] == lp.decoded_token
    chat = client.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": "Hi"}], max_tokens=1, extra_body=dict(prompt_logprobs=0)
    )
    lps = chat.model_extra["prompt_logprobs"]
    assert lps[0] is None and all(len(d) == 1 for d in lps[1:])


@pytest.mark.parametrize(
    "kw, extra, param",
    [
        ({}, dict(repetition_penalty=0), "repetition_penalty"),
        (dict(presence_penalty=2.5), None, "presence_penalty"),
        (dict(logit_bias={"x": 1}), None, "logit_bias.x"),
        (dict(logit_bias={"1000000": 1}), None, "logit_bias"),
        ({}, dict(allowed_token_ids=[]), "allowed_token_ids"),
        ({}, dict(min_tokens=20), "min_tokens"),
        ({}, dict(prompt_logprobs=1), "prompt_logprobs"),  # with stream
        ({}, dict(truncate_prompt_tokens=0), "truncate_prompt_tokens"),
    ],
)
def test_bad_values_are_400s_naming_the_field(client, model_name, kw, extra, param):
    stream = extra is not None and "prompt_logprobs" in extra
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model_name, prompt=PROMPT, max_tokens=10, stream=stream, extra_body=extra, **kw)
    assert e.value.body["param"] == param


def test_completion_top_logprobs_keep_the_best_rank_of_tokens_that_decode_alike():
    """Byte-fallback tokens all decode to U+FFFD: the legacy map's key then holds the best-ranked one's logprob (the
    sampled token's here), not the last one's."""
    from attnserve.engine.outputs import CompletionOutput, Logprob
    from attnserve.entrypoints.openai.serving_completion import _logprobs

    entry = {
        7: Logprob(-1.25, 1, "\ufffd"),
        8: Logprob(-2.5, 2, " a"),
        9: Logprob(-3.5, 3, "\ufffd"),
    }
    lp = _logprobs(CompletionOutput(0, "", [7], logprobs=[entry]), 0, 1, 0)
    assert lp.token_logprobs == [-1.25]
    assert lp.top_logprobs == [{"\ufffd": -1.25, " a": -2.5}]
    assert list(lp.top_logprobs[0]) == ["\ufffd", " a"]
