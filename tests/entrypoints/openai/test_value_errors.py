"""A request value of the wrong type or out of range: a 400 in OpenAI's format whose message names the field (its
``param``), the value as sent and what the field allows (each case names these three, not the words between them) (from the request schema's declared ranges), and the server keeps
serving. Was pydantic's wording: 'Unable to parse input string as an integer, exceeded maximum size' for
``max_tokens: 1e20``, 'Input should be a valid integer, got a number with a fractional part' for ``n: 1.5``.

Types are strict, as in OpenAI's API: a string is not a number (``"temperature": "0.5"`` and ``"n": "2"`` were
accepted), a boolean is not an integer (``"max_tokens": true`` was 1) nor a string a boolean (``"stream":
"yes"`` was true). An integer field refuses any JSON number with a fraction part or an exponent, ``2.0`` too
(``n: 2.0 is not an integer``), as OpenAI's API does: Python's JSON parser makes ``2.0`` a float, and a float
that happens to be whole is not told apart from one that is not. A number field takes an integer
(``"temperature": 1``)."""

from __future__ import annotations

import openai
import pytest

from tests.entrypoints.openai.utils import assert_refused

# every seed's range, in the words SamplingParams, LLM(seed=) and --seed use (was "integer in [-2^63, 2^63 - n] for
# the request's n, or null"; before that "integer in [-9223372036854775808, 9223372036854774783], or null")
SEED_RANGE = "integer in [-2^63, 2^63 - 1], or null"
STOP_WORDS = "a non-empty string, a list of non-empty strings, or null"
EMPTY_PROMPT = "a prompt of at least 1 token"
VOCAB = 49152  # the default model's (SmolLM2-135M)
TOKEN_IDS = f"integer in [0, {VOCAB}), the vocabulary size"

COMPLETION_CASES = {
    "max_tokens_1e20": ({"max_tokens": 1e20}, "max_tokens", "1e+20", "integer >= 1, or null"),
    "max_tokens_fraction": (
        {"max_tokens": 1.5},
        "max_tokens",
        "1.5",
        "integer >= 1, or null",
    ),
    "max_tokens_text": (
        {"max_tokens": "abc"},
        "max_tokens",
        '"abc"',
        "integer >= 1, or null",
    ),
    "max_tokens_list": ({"max_tokens": [1]}, "max_tokens", "[1]", "integer >= 1, or null"),
    "max_tokens_0": ({"max_tokens": 0}, "max_tokens", "0", "integer >= 1, or null"),
    "n_fraction": ({"n": 1.5}, "n", "1.5", "integer in [1, 128]"),
    "n_1e20": ({"n": 1e20}, "n", "1e+20", "integer in [1, 128]"),
    "n_129": ({"n": 129}, "n", "129", "integer in [1, 128]"),
    "seed_fraction": ({"seed": 0.5}, "seed", "0.5", SEED_RANGE),
    # the engine's --max-logprobs (20 by default, as vLLM's)
    "logprobs_21": (
        {"logprobs": 21},
        "logprobs",
        "21",
        "integer in [0, 20], the engine's max_logprobs (--max-logprobs)",
    ),
    "temperature_text": (
        {"temperature": "hot"},
        "temperature",
        '"hot"',
        "number >= 0, or null",
    ),
    "top_p_0": ({"top_p": 0}, "top_p", "0", "number in (0, 1], or null"),
    "echo_3": ({"echo": 3}, "echo", "3", "true, false, or null"),
    "stop_token_ids_fraction": (
        {"extra_body": {"stop_token_ids": [2, 1.5]}},
        "stop_token_ids.1",
        "1.5",
        "integer >= 0",
    ),
    # outside the model's vocabulary (was accepted: a stop token that can never be sampled); LLMEngine.check_params
    "stop_token_ids_out_of_vocab": (
        {"extra_body": {"stop_token_ids": [2, VOCAB]}},
        "stop_token_ids.1",
        str(VOCAB),
        TOKEN_IDS,
    ),
    "prompt_token_fraction": ({"prompt": [1, 2.5]}, "prompt.1", "2.5", "integer >= 0"),
    "prompt_token_negative": ({"prompt": [[1, -2]]}, "prompt.0.1", "-2", "integer >= 0"),
    # strict types
    "n_text": ({"n": "2"}, "n", '"2"', "integer in [1, 128]"),
    "n_whole_float": ({"n": 2.0}, "n", "2.0", "integer in [1, 128]"),
    "max_tokens_true": ({"max_tokens": True}, "max_tokens", "true", "integer >= 1, or null"),
    "logprobs_false": ({"logprobs": False}, "logprobs", "false", "integer >= 0, or null"),
    "stream_yes": ({"stream": "yes"}, "stream", '"yes"', "true, false, or null"),
    "temperature_text_number": (
        {"temperature": "0.5"},
        "temperature",
        '"0.5"',
        "number >= 0, or null",
    ),
    "top_p_true": ({"top_p": True}, "top_p", "true", "number in (0, 1], or null"),
    "prompt_token_true": (
        {"prompt": [1, True]},
        "prompt",
        "[1, true]",
        "a string, a list of strings, a list of integers >= 0, or a list of lists of integers >= 0",
    ),
    "stop_number": ({"stop": 5}, "stop", "5", STOP_WORDS),
    # an empty stop string: refused by the schema with the value as sent (was "stop [''] not allowed (allowed:
    # non-empty strings)", SamplingParams' Python list, for "stop": "" too)
    "stop_empty": ({"stop": ""}, "stop", '""', STOP_WORDS),
    "stop_empty_in_list": ({"stop": ["a", ""]}, "stop.1", '""', "non-empty string"),
    # an empty prompt, whatever its form: one wording, the value as sent (were "prompt is empty" for [], "the
    # prompt is empty (0 tokens)" for "" and [[]]; a tokenizer that adds BOS ran "" as that one token)
    "prompt_empty": ({"prompt": ""}, "prompt", '""', EMPTY_PROMPT),
    "prompt_empty_list": ({"prompt": []}, "prompt", "[]", EMPTY_PROMPT),
    "prompt_second_empty": ({"prompt": ["a", ""]}, "prompt.1", '""', EMPTY_PROMPT),
    "prompt_second_no_token_ids": ({"prompt": [[1], []]}, "prompt.1", "[]", EMPTY_PROMPT),
    "seed_above_int64": ({"seed": 2**63}, "seed", "9223372036854775808", SEED_RANGE),
    "seed_below_int64": ({"seed": -(2**63) - 1}, "seed", "-9223372036854775809", SEED_RANGE),
}


def _valid(client, model_name) -> None:
    r = client.completions.create(model=model_name, prompt="Hi", max_tokens=1, temperature=0)
    assert len(r.choices) == 1 and r.choices[0].finish_reason in ("length", "stop")


@pytest.mark.parametrize("case", list(COMPLETION_CASES), ids=list(COMPLETION_CASES))
def test_completion_value_errors_name_field_value_and_allowed(client, model_name, case):
    fields, param, value, allowed = COMPLETION_CASES[case]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model_name, **{"prompt": "Hi", "max_tokens": 2, **fields})
    assert e.value.status_code == 400
    assert_refused(e.value.body, param, value, allowed)
    _valid(client, model_name)


CHAT = [{"role": "user", "content": "Hi"}]
CONTENT_WORDS = 'a string, or a non-empty list of text parts {"type": "text", "text": string}'
CHAT_CASES = {
    "max_completion_tokens_1e20": (
        {"max_completion_tokens": 1e20},
        "max_completion_tokens",
        "1e+20",
        "integer >= 1, or null",
    ),
    "max_tokens_fraction": (
        {"max_tokens": 2.5},
        "max_tokens",
        "2.5",
        "integer >= 1, or null",
    ),
    "top_logprobs_fraction": (
        {"logprobs": True, "top_logprobs": 1.5},
        "top_logprobs",
        "1.5",
        "integer >= 0, or null",
    ),
    "logprobs_text": ({"logprobs": "maybe"}, "logprobs", '"maybe"', "true, false, or null"),
    "role": (
        {"messages": [{"role": "wizard", "content": "Hi"}]},
        "messages.0.role",
        '"wizard"',
        '"system", "developer", "user", "assistant", "tool"',
    ),
    "content": (
        {"messages": [{"role": "user", "content": 5}]},
        "messages.0.content",  # was param "messages"
        "5",
        CONTENT_WORDS,
    ),
    # content is required for every role (was accepted as ""): an assistant message may go without it in
    # OpenAI's API only with tool calls, which attnserve has not
    "user_without_content": (
        {"messages": [{"role": "user"}]},
        "messages.0.content",
        "missing",
        CONTENT_WORDS,
    ),
    "system_without_content": (
        {"messages": [{"role": "system"}, *CHAT]},
        "messages.0.content",
        "missing",
        CONTENT_WORDS,
    ),
    "assistant_without_content": (
        {"messages": [*CHAT, {"role": "assistant"}, *CHAT]},
        "messages.1.content",
        "missing",
        CONTENT_WORDS,
    ),
    "user_content_null": (
        {"messages": [{"role": "user", "content": None}]},
        "messages.0.content",
        "null",
        CONTENT_WORDS,
    ),
    "role_missing": (
        {"messages": [{"content": "Hi"}]},
        "messages.0.role",
        "missing",
        '"system", "developer", "user", "assistant", "tool"',
    ),
    # a list or an object where it does not belong, or a list too short (were "List should have at least 1 item
    # after validation, not 0", "Input should be a valid list", "Input should be a valid dictionary or instance of
    # ChatMessage"); content [] was accepted
    "messages_empty": ({"messages": []}, "messages", "[]", "a non-empty list of chat messages"),
    "messages_string": (
        {"messages": "hi"},
        "messages",
        '"hi"',
        "a non-empty list of chat messages",
    ),
    "message_number": (
        {"messages": [1]},
        "messages.0",
        "1",
        'an object with "role" and "content", optionally "name", "tool_calls" and "tool_call_id"',
    ),
    "content_empty_list": (
        {"messages": [{"role": "user", "content": []}]},
        "messages.0.content",
        "[]",
        CONTENT_WORDS,
    ),
    "content_part_number": (
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}, 5]}]},
        "messages.0.content.1",
        "5",
        'an object with "type" and "text"',
    ),
    "stream_options_number": (
        {"stream": True, "stream_options": 5},
        "stream_options",
        "5",
        'an object with optional "include_usage" and "continuous_usage_stats", or null',
    ),
    "max_tokens_true": ({"max_tokens": True}, "max_tokens", "true", "integer >= 1, or null"),
    "n_text": ({"n": "2"}, "n", '"2"', "integer in [1, 128]"),
    "temperature_text": (
        {"temperature": "0.5"},
        "temperature",
        '"0.5"',
        "number >= 0, or null",
    ),
    "stop_token_ids_out_of_vocab": (
        {"extra_body": {"stop_token_ids": [10**9]}},
        "stop_token_ids.0",
        "1000000000",
        TOKEN_IDS,
    ),
    "stream_yes": ({"stream": "yes"}, "stream", '"yes"', "true, false, or null"),
}


@pytest.mark.parametrize("case", list(CHAT_CASES), ids=list(CHAT_CASES))
def test_chat_value_errors_name_field_value_and_allowed(client, model_name, case):
    fields, param, value, allowed = CHAT_CASES[case]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model_name, **{"messages": CHAT, "max_tokens": 1, **fields})
    assert e.value.status_code == 400
    assert_refused(e.value.body, param, value, allowed)
    _valid(client, model_name)


def test_several_bad_fields_are_named_in_one_message(server, client, model_name):
    """The golden body of this surface: each field's refusal, joined; param the first field's path."""
    r = server.post("/v1/completions", json={"prompt": "Hi", "n": 0, "max_tokens": 1e20, "stream": "maybe"})
    assert r.status_code == 400
    assert r.json() == {
        "error": {
            "message": 'n: 0 not allowed (allowed: integer in [1, 128]); stream: "maybe" is not a boolean (allowed: true, '
            "false, or null); max_tokens: 1e+20 is not an integer (allowed: integer >= 1, or null)",
            "type": "invalid_request_error",
            "param": "n",
            "code": None,
        }
    }
    _valid(client, model_name)


def test_an_integer_where_a_number_goes_is_accepted(server):
    r = server.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1, "temperature": 0, "top_p": 1})
    assert r.status_code == 200, r.text


def test_every_seed_in_the_range_is_accepted_with_every_n(server):
    """Completion i uses seed + i wrapped to 64 bits (was refused above 2^63 - n: "not allowed with n = 3")."""
    r = server.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1, "n": 3, "seed": 2**63 - 1})
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == 3
    r = server.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1, "seed": -(2**63)})
    assert r.status_code == 200, r.text


MISSING = {
    # was "messages: Field required", "prompt: Field required"
    "chat_messages": (
        "/v1/chat/completions",
        {"max_tokens": 1},
        "messages",
        "missing",
        "a non-empty list of chat messages",
    ),
    "completion_prompt": (
        "/v1/completions",
        {"max_tokens": 1},
        "prompt",
        "missing",
        "a string, a list of strings, a list of integers >= 0, or a list of lists of integers >= 0",
    ),
}


@pytest.mark.parametrize("case", list(MISSING), ids=list(MISSING))
def test_missing_required_field(server, client, model_name, case):
    """model is not required: absent or "" is the served model (as vLLM)."""
    path, body, param, value, allowed = MISSING[case]
    r = server.post(path, json=body)
    assert r.status_code == 400
    assert_refused(r.json()["error"], param, value, allowed)
    _valid(client, model_name)


# JSON has no infinity: Python's parser reads a number beyond the largest double (1e400) as one, and NaN and
# Infinity as its extensions; the message echoes the number as sent (was "max_tokens: Infinity is not a finite
# number", then "max_tokens: number too large, not finite")
NOT_FINITE = {
    "max_tokens_1e400": (
        b'{"prompt": "Hi", "max_tokens": 1e400}',
        "max_tokens",
        "1e400",
        "integer >= 1, or null",
    ),
    "temperature_minus_1e400": (
        b'{"prompt": "Hi", "temperature": -1e400}',
        "temperature",
        "-1e400",
        "number >= 0, or null",
    ),
    "top_p_1E999": (
        b'{"prompt": "Hi", "top_p": 1.5E999}',
        "top_p",
        "1.5E999",
        "number in (0, 1], or null",
    ),
    "seed_1e400": (
        b'{"prompt": "Hi", "seed": 1e400}',
        "seed",
        "1e400",
        SEED_RANGE,
    ),
    "prompt_token_1e400": (
        b'{"prompt": [1, 1e400]}',
        "prompt.1",
        "1e400",
        "integer >= 0",
    ),
    "stop_1e400": (b'{"prompt": "Hi", "stop": 1e400}', "stop", "1e400", STOP_WORDS),
    "temperature_nan": (
        b'{"prompt": "Hi", "temperature": NaN}',
        "temperature",
        "NaN",
        "number >= 0, or null",
    ),
    "temperature_infinity": (
        b'{"prompt": "Hi", "temperature": -Infinity}',
        "temperature",
        "-Infinity",
        "number >= 0, or null",
    ),
}


@pytest.mark.parametrize("case", list(NOT_FINITE), ids=list(NOT_FINITE))
def test_not_finite_number(server, client, model_name, case):
    body, param, value, allowed = NOT_FINITE[case]
    r = server.post("/v1/completions", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    assert_refused(r.json()["error"], param, value, allowed)
    _valid(client, model_name)
