"""The offline ``LLM`` API's input shapes (vLLM's): prompt dicts and chat messages, on a tiny random Llama."""

from __future__ import annotations

import numpy as np
import pytest

from attnserve import LLM, SamplingParams
from attnserve.engine.request_checks import MaxTokensTooLargeError, PromptTooLongError, RequestValueError
from attnserve.refusals.requests import PROMPT_KINDS as PROMPT_WORDS
from attnserve.refusals import MISSING, Refusal
from attnserve.refusals.requests import MESSAGE_WORDS

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
IDS = [504, 3575, 282, 4649, 314]


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    return LLM(tiny_model_dir("llama"), dtype="float32", device="cpu", block_size=4, kv_cache_memory=8 << 20)


def test_a_tokens_prompt_dict_equals_its_token_ids(llm):
    (ref,) = llm.generate(IDS, GREEDY)
    (out,) = llm.generate({"prompt_token_ids": IDS}, GREEDY)
    assert out.outputs[0].token_ids == ref.outputs[0].token_ids
    assert out.prompt is None and out.prompt_token_ids == IDS  # as for a plain token-id list


def test_text_and_tokens_prompt_dicts_mixed_with_plain_prompts(llm):
    outs = llm.generate([{"prompt": "Hi"}, "Hi", {"prompt_token_ids": IDS}, IDS], GREEDY)
    hi_ids = llm.tokenizer.encode("Hi")
    assert [o.prompt for o in outs] == ["Hi", "Hi", None, None]
    assert [o.prompt_token_ids for o in outs] == [hi_ids, hi_ids, IDS, IDS]
    assert outs[0].outputs[0].token_ids == outs[1].outputs[0].token_ids
    assert outs[2].outputs[0].token_ids == outs[3].outputs[0].token_ids


ONE_OF = "exactly one of the keys 'prompt', 'prompt_token_ids'"


@pytest.mark.parametrize(
    "prompt, path, value, allowed",
    [
        ({"prompt": "Hi", "prompt_token_ids": IDS}, ("prompts", 1), ["prompt", "prompt_token_ids"], ONE_OF),
        ({"text": "Hi"}, ("prompts", 1), ["text"], ONE_OF),
        ({}, ("prompts", 1), [], ONE_OF),
        ({"prompt": IDS}, ("prompts", 1, "prompt"), IDS, "a string"),
        ({"prompt_token_ids": "Hi"}, ("prompts", 1, "prompt_token_ids"), "Hi", "a list of token ids"),
        (None, ("prompts", 1), None, PROMPT_WORDS),
        (b"Hi", ("prompts", 1), b"Hi", PROMPT_WORDS),
        (2.5, ("prompts", 1), 2.5, PROMPT_WORDS),
    ],
)
def test_other_prompts_are_refused_up_front(llm, prompt, path, value, allowed):
    with pytest.raises(ValueError) as e:
        llm.generate(["Hi", prompt], GREEDY)
    r = e.value.refusal
    assert (r.path, r.value, r.allowed) == (path, value, allowed)
    assert not llm.engine.has_unfinished_requests()


@pytest.mark.parametrize("prompt", [None, b"Hi"])
def test_a_single_prompt_of_no_kind_is_refused(llm, prompt):
    with pytest.raises(ValueError) as e:
        llm.generate(prompt, GREEDY)
    assert (e.value.refusal.path, e.value.refusal.value) == (("prompt",), prompt)


@pytest.mark.parametrize(
    "params, path, value, allowed",
    [
        (
            {"max_tokens": 2},
            ("sampling_params",),
            {"max_tokens": 2},
            "a SamplingParams, a list of 2 (one per prompt), or None",
        ),
        ([GREEDY, {"max_tokens": 2}], ("sampling_params", 1), {"max_tokens": 2}, "a SamplingParams"),
    ],
    ids=["dict", "dict_in_list"],
)
def test_sampling_params_of_another_kind_are_refused(llm, params, path, value, allowed):
    """A dict of SamplingParams' fields was an AttributeError (``'dict' object has no attribute
    'truncate_prompt_tokens'``); now a refusal naming it, before any work."""
    with pytest.raises(ValueError) as e:
        llm.generate(["Hi", "there"], params)
    r = e.value.refusal
    assert (r.path, r.value, r.allowed) == (path, value, allowed)
    assert not llm.engine.has_unfinished_requests()


def test_get_tokenizer_is_the_prompts_tokenizer(llm):
    """vLLM's ``LLM.get_tokenizer()``."""
    assert llm.get_tokenizer() is llm.tokenizer is llm.engine.tokenizer


def test_numpy_token_ids_become_plain_ints(llm):
    (out,) = llm.generate([[np.int64(t) for t in IDS]], GREEDY)
    assert out.prompt_token_ids == IDS and {type(t) for t in out.prompt_token_ids} == {int}


def test_a_prompt_dict_refusal_reads_as_one_line(llm):
    """The golden text of this refusal on the Python surface."""
    with pytest.raises(ValueError) as e:
        llm.generate({"text": "Hi"}, GREEDY)
    assert str(e.value) == f"prompt ['text'] not allowed (allowed: {ONE_OF})"


def _rendered(llm, messages):
    return llm.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def test_chat_output_carries_the_rendered_prompt(llm):
    messages = [{"role": "user", "content": "Hi"}]
    (out,) = llm.chat(messages, GREEDY)
    assert out.prompt == _rendered(llm, messages)
    assert out.prompt_token_ids == llm.tokenizer.encode(out.prompt, add_special_tokens=False)


def test_chat_message_with_empty_content_is_that_empty_text(llm):
    (out,) = llm.chat([{"role": "user", "content": ""}], GREEDY)
    assert out.prompt == _rendered(llm, [{"role": "user", "content": ""}])


def test_chat_text_parts_are_joined_as_in_the_server(llm):
    parts = [{"type": "text", "text": "Hi"}, {"type": "text", "text": " there"}]
    (out,) = llm.chat([{"role": "user", "content": parts}], GREEDY)
    assert out.prompt == _rendered(llm, [{"role": "user", "content": "Hi there"}])


# the server's words (its request schema's; test_chat_utils.py holds chat_utils to them), Python's places and values
ROLES = '"system", "developer", "user", "assistant", "tool"'
CONTENT = 'a string, or a non-empty list of text parts {"type": "text", "text": string}'
MESSAGES = "a non-empty list of chat messages"
HI = [{"role": "user", "content": "Hi"}]


PART = 'a text part {"type": "text", "text": string}'
BATCH = f"{MESSAGES}, or a list of such lists"


@pytest.mark.parametrize(
    "messages, path, value, allowed, noun",
    [
        ([{"content": "Hi"}], ("messages", 0, "role"), MISSING, ROLES, None),
        (
            [{"role": "user", "content": "Hi"}, {"role": "bot", "content": "x"}],
            ("messages", 1, "role"),
            "bot",
            ROLES,
            None,
        ),
        ([{"role": "user", "content": 5}], ("messages", 0, "content"), 5, CONTENT, None),
        ([{"role": "user", "content": "Hi", "name": 3}], ("messages", 0, "name"), 3, "string, or None", "a string"),
        # a batch's conversation by its index (was "conversation 1: messages[0]...")
        (
            [HI, [{"role": "user", "content": [{"type": "image_url"}]}]],
            ("messages", 1, 0, "content", 0, "type"),
            "image_url",
            '"text"',
            None,
        ),
        (
            [HI, [{"role": "user", "content": [{"type": "text"}]}]],
            ("messages", 1, 0, "content", 0, "text"),
            MISSING,
            "a string",
            None,
        ),
        (
            [{"role": "user", "content": [{"type": "text", "text": "Hi"}, 5]}],
            ("messages", 0, "content", 1),
            5,
            'an object with "type" and "text"',
            PART,
        ),
        # content is required whatever the role, as the server requires it (was read as "", a message never written);
        # an assistant may go without it in OpenAI's API only with tool calls, which attnserve has not
        ([{"role": "user"}], ("messages", 0, "content"), MISSING, CONTENT, None),
        (
            [{"role": "system", "content": "Be brief."}, {"role": "user"}],
            ("messages", 1, "content"),
            MISSING,
            CONTENT,
            None,
        ),
        (
            [{"role": "user", "content": "Hi"}, {"role": "assistant"}, {"role": "user", "content": "Hi"}],
            ("messages", 1, "content"),
            MISSING,
            CONTENT,
            None,
        ),
        ([{"role": "user", "content": None}], ("messages", 0, "content"), None, CONTENT, None),
        ([HI, [{"role": "user"}]], ("messages", 1, 0, "content"), MISSING, CONTENT, None),
        ([HI, []], ("messages", 1), [], MESSAGES, None),
        ([HI, "Hi"], ("messages", 1), "Hi", MESSAGES, "a list"),
        # were accepted: content [] (rendered as an empty message), as the server refuses it
        ([{"role": "user", "content": []}], ("messages", 0, "content"), [], CONTENT, None),
        # the messages themselves: LLM.chat takes one conversation or a list of them (were: "messages [] not allowed
        # (allowed: a non-empty list of message dicts)", and for "hi" "messages[0] 'h' not allowed", its first character)
        ([], ("messages",), [], BATCH, None),
        ("hi", ("messages",), "hi", BATCH, "a list"),
        ({"role": "user", "content": "Hi"}, ("messages",), {"role": "user", "content": "Hi"}, BATCH, "a list"),
        (None, ("messages",), None, BATCH, "a list"),
        ([1], ("messages", 0), 1, MESSAGE_WORDS, "a chat message"),
        (["hi"], ("messages", 0), "hi", MESSAGE_WORDS, "a chat message"),
    ],
)
def test_bad_chat_messages_are_refused_up_front(llm, messages, path, value, allowed, noun):
    with pytest.raises(RequestValueError) as e:
        llm.chat(messages, GREEDY)
    assert e.value.refusal == Refusal(path, value, allowed, noun=noun)
    assert not llm.engine.has_unfinished_requests()


def test_a_chat_message_refusal_reads_as_one_line(llm):
    """The golden texts of a request refusal on the Python surface: the place as Python indexes it, the value as
    Python writes it; a value of another kind, and a missing key."""
    with pytest.raises(RequestValueError) as e:
        llm.chat([HI, [{"role": "user", "content": [{"type": "image_url"}]}]], GREEDY)
    assert str(e.value) == "messages[1][0].content[0].type 'image_url' not allowed (allowed: \"text\")"
    with pytest.raises(RequestValueError) as e:
        llm.chat([HI, "Hi"], GREEDY)
    assert str(e.value) == f"messages[1] 'Hi' is not a list (allowed: {MESSAGES})"
    with pytest.raises(RequestValueError) as e:
        llm.chat([{"role": "user"}], GREEDY)
    assert str(e.value) == f"messages[0].content missing (required: {CONTENT})"


# LLM.generate refuses what the server refuses, in its words (engine/request_checks.py), before any work: the place
# as Python indexes it (the server's param dotted: prompt.1.2), the value as Python writes it (the server's as JSON)
VOCAB = 49152  # the tiny models' (the default model's tokenizer)
TOKEN_IDS = f"integer in [0, {VOCAB}), the vocabulary size"
EMPTY = "a prompt of at least 1 token"
SHORT_LEN = 16
TOO_LONG = (
    f"This model's maximum context length is {SHORT_LEN} tokens. However, {{}} has 20 tokens, which leaves no "
    f"room for the completion (at most {SHORT_LEN - 1} prompt tokens fit). Please raise max_model_len or reduce "
    "the length of the prompt."
)
TOO_MANY = (
    f"This model's maximum context length is {SHORT_LEN} tokens. However, you requested 18 tokens (10 in {{}}, "
    "8 in the completion). Please reduce the length of the prompt or completion."
)


@pytest.fixture(scope="module")
def short_llm(tiny_model_dir):
    return LLM(
        tiny_model_dir("llama"),
        dtype="float32",
        device="cpu",
        block_size=4,
        kv_cache_memory=8 << 20,
        max_model_len=SHORT_LEN,
    )


def _bad(path, value, allowed):
    return dict(path=path, value=value, allowed=allowed)


def _too_long(prompt):  # OpenAI's words name the prompt in the reason; the counts are fields
    return dict(num_prompt_tokens=20, max_model_len=SHORT_LEN, key="max_model_len", prompt=prompt)


def _too_many(prompt):
    return dict(num_prompt_tokens=10, max_tokens=8, max_model_len=SHORT_LEN, prompt=prompt)


GENERATE_REFUSALS = {
    # an empty prompt, whatever its form (was "prompt is empty (0 tokens)", and "" ran as a lone BOS token where
    # the tokenizer adds one)
    "empty_text": ("", 1, RequestValueError, _bad(("prompt",), "", EMPTY)),
    "empty_text_in_batch": (["Hi", ""], 1, RequestValueError, _bad(("prompts", 1), "", EMPTY)),
    "empty_token_ids_in_batch": ([[1], []], 1, RequestValueError, _bad(("prompts", 1), [], EMPTY)),
    "empty_prompt_dict": ({"prompt": ""}, 1, RequestValueError, _bad(("prompt",), "", EMPTY)),
    "empty_token_ids_dict": ({"prompt_token_ids": []}, 1, RequestValueError, _bad(("prompt",), [], EMPTY)),
    # a token id outside the vocabulary by its position (was "token id 49152 not allowed (...)")
    "token_id": ([1, 2, VOCAB], 1, RequestValueError, _bad(("prompt", 2), VOCAB, TOKEN_IDS)),
    "token_id_in_batch": ([[1], [1, -1]], 1, RequestValueError, _bad(("prompts", 1, 1), -1, TOKEN_IDS)),
    "token_id_in_dict": ({"prompt_token_ids": [10**9]}, 1, RequestValueError, _bad(("prompt", 0), 10**9, TOKEN_IDS)),
    # the prompt alone leaves no room: the server's words and rule (was "prompt has 20 tokens; max_model_len is 16,
    # ...")
    "prompt_too_long": ([1] * 20, None, PromptTooLongError, _too_long("the prompt")),
    "prompt_too_long_in_batch": ([[1], [1] * 20], 1, PromptTooLongError, _too_long("prompts[1]")),
    # the prompt fits but not with max_tokens more (was accepted, and ran to max_model_len: one CPU call of a
    # fresh-user trial ran for over 10 minutes)
    "max_tokens": ([1] * 10, 8, MaxTokensTooLargeError, _too_many("the prompt")),
    "max_tokens_in_batch": ([[1], [1] * 10], 8, MaxTokensTooLargeError, _too_many("prompts[1]")),
}


@pytest.mark.parametrize("case", list(GENERATE_REFUSALS), ids=list(GENERATE_REFUSALS))
def test_generate_refuses_as_the_server_does(short_llm, case):
    prompts, max_tokens, error, fields = GENERATE_REFUSALS[case]
    with pytest.raises(error) as e:
        short_llm.generate(prompts, SamplingParams(max_tokens=max_tokens))
    assert isinstance(e.value, ValueError)
    fields = dict(fields)
    prompt = fields.pop("prompt", None)
    assert {name: getattr(e.value, name) for name in fields} == fields
    if prompt is not None:
        assert f" {prompt}" in e.value.refusal.reason  # the place, which is no field of these two
    assert not short_llm.engine.has_unfinished_requests()  # refused before anything was queued


def test_generate_refusals_read_as_one_line(short_llm):
    """The golden texts on the Python surface: a bad value at its place, and OpenAI's two context-length lines."""
    with pytest.raises(RequestValueError) as e:
        short_llm.generate([[1], [1, -1]], SamplingParams(max_tokens=1))
    assert str(e.value) == f"prompts[1][1] -1 not allowed (allowed: {TOKEN_IDS})"
    with pytest.raises(PromptTooLongError) as e:
        short_llm.generate([[1], [1] * 20], SamplingParams(max_tokens=1))
    assert str(e.value) == TOO_LONG.format("prompts[1]")
    with pytest.raises(MaxTokensTooLargeError) as e:
        short_llm.generate([[1], [1] * 10], SamplingParams(max_tokens=8))
    assert str(e.value) == TOO_MANY.format("prompts[1]")


def test_generate_runs_a_prompt_up_to_the_whole_context(short_llm):
    """The ends of the rule: prompt + max_tokens == max_model_len runs, max_tokens None takes the rest."""
    greedy = dict(temperature=0.0, ignore_eos=True)
    (out,) = short_llm.generate([1] * 10, SamplingParams(max_tokens=6, **greedy))
    assert len(out.outputs[0].token_ids) == 6 and out.outputs[0].finish_reason == "length"
    (out,) = short_llm.generate([1] * 15, SamplingParams(max_tokens=None, **greedy))
    assert len(out.outputs[0].token_ids) == 1


def test_chat_refuses_a_conversation_too_long_as_generate_does(llm, short_llm):
    messages = [{"role": "user", "content": "Hi"}]
    n = len(llm.tokenizer.encode(_rendered(llm, messages), add_special_tokens=False))  # 31: a default system prompt
    limit = llm.engine.max_model_len
    with pytest.raises(MaxTokensTooLargeError) as e:
        llm.chat([messages, messages], SamplingParams(max_tokens=limit))
    assert str(e.value) == (
        f"This model's maximum context length is {limit} tokens. However, you requested "
        f"{n + limit} tokens ({n} in messages[0], {limit} in the completion). Please reduce "
        "the length of the prompt or completion."
    )
    with pytest.raises(PromptTooLongError) as e:
        short_llm.chat(messages, SamplingParams(max_tokens=1))
    assert str(e.value) == (
        f"This model's maximum context length is {SHORT_LEN} tokens. However, the prompt has {n} "
        f"tokens, which leaves no room for the completion (at most {SHORT_LEN - 1} prompt tokens "
        "fit). Please raise max_model_len or reduce the length of the prompt."
    )
    assert not llm.engine.has_unfinished_requests() and not short_llm.engine.has_unfinished_requests()


def test_chat_takes_vllms_template_options(llm):
    template = (
        "{% for m in messages %}{{ m['role'] }}:{{ m['content'] }}|{% endfor %}"
        "{% if flag is defined %}[{{ flag }}]{% endif %}{% if add_generation_prompt %}A:{% endif %}"
    )
    (out,) = llm.chat(HI, GREEDY, chat_template=template, chat_template_kwargs={"flag": 1})
    assert out.prompt == "user:Hi|[1]A:"
    assert out.prompt_token_ids == llm.tokenizer.encode("user:Hi|[1]A:", add_special_tokens=False)
    prefill = [*HI, {"role": "assistant", "content": "Hel"}]
    (out,) = llm.chat(prefill, GREEDY, chat_template=template, add_generation_prompt=False, continue_final_message=True)
    assert out.prompt == "user:Hi|assistant:Hel"
    with pytest.raises(ValueError) as e:  # both: refused before anything is queued, as vLLM refuses it
        llm.chat(prefill, GREEDY, continue_final_message=True)
    assert e.value.path == ("continue_final_message",)
    assert not llm.engine.has_unfinished_requests()


def test_chat_passes_tools_to_the_template(llm):
    template = "{% for t in tools or [] %}<{{ t['function']['name'] }}>{% endfor %}{{ messages[0]['content'] }}"
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    (out,) = llm.chat(HI, GREEDY, chat_template=template, tools=tools)
    assert out.prompt == "<get_weather>Hi"
    (out,) = llm.chat(HI, GREEDY, chat_template=template)
    assert out.prompt == "Hi"
    for bad in ("get_weather", [1]):
        with pytest.raises(ValueError) as e:
            llm.chat(HI, GREEDY, chat_template=template, tools=bad)
        assert e.value.path == ("tools",) and e.value.refusal.value == bad
    assert not llm.engine.has_unfinished_requests()
