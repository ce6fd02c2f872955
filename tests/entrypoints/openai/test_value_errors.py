"""A request value of the wrong type or out of range: a 400 in OpenAI's format whose message names the field, the
value as sent and what the field allows (from the request schema's declared ranges), and the server keeps
serving. Was pydantic's wording: 'Unable to parse input string as an integer, exceeded maximum size' for
``max_tokens: 1e20``, 'Input should be a valid integer, got a number with a fractional part' for ``n: 1.5``."""

from __future__ import annotations

import openai
import pytest

SEED_RANGE = "integer in [-9223372036854775808, 9223372036854774783], or null"

COMPLETION_CASES = {
    "max_tokens_1e20": ({"max_tokens": 1e20}, "max_tokens", "1e+20 is not an integer (allowed: integer >= 1, or null)"),
    "max_tokens_fraction": ({"max_tokens": 1.5}, "max_tokens", "1.5 is not an integer (allowed: integer >= 1, or null)"),
    "max_tokens_text": ({"max_tokens": "abc"}, "max_tokens",
                        '"abc" is not an integer (allowed: integer >= 1, or null)'),
    "max_tokens_list": ({"max_tokens": [1]}, "max_tokens", "[1] is not an integer (allowed: integer >= 1, or null)"),
    "max_tokens_0": ({"max_tokens": 0}, "max_tokens", "0 not allowed (allowed: integer >= 1, or null)"),
    "n_fraction": ({"n": 1.5}, "n", "1.5 is not an integer (allowed: integer in [1, 128])"),
    "n_1e20": ({"n": 1e20}, "n", "1e+20 is not an integer (allowed: integer in [1, 128])"),
    "n_129": ({"n": 129}, "n", "129 not allowed (allowed: integer in [1, 128])"),
    "seed_fraction": ({"seed": 0.5}, "seed", f"0.5 is not an integer (allowed: {SEED_RANGE})"),
    "logprobs_21": ({"logprobs": 21}, "logprobs", "21 not allowed (allowed: integer in [0, 20], or null)"),
    "temperature_text": ({"temperature": "hot"}, "temperature",
                         '"hot" is not a number (allowed: number >= 0, or null)'),
    "top_p_0": ({"top_p": 0}, "top_p", "0 not allowed (allowed: number in (0, 1], or null)"),
    "echo_3": ({"echo": 3}, "echo", "3 is not a boolean (allowed: true, false, or null)"),
    "stop_token_ids_fraction": ({"extra_body": {"stop_token_ids": [2, 1.5]}}, "stop_token_ids.1",
                                "1.5 is not an integer (allowed: integer >= 0)"),
    "prompt_token_fraction": ({"prompt": [1, 2.5]}, "prompt.1", "2.5 is not an integer (allowed: integer >= 0)"),
    "prompt_token_negative": ({"prompt": [[1, -2]]}, "prompt.0.1", "-2 not allowed (allowed: integer >= 0)"),
}


def _valid(client, model_name) -> None:
    r = client.completions.create(model=model_name, prompt="Hi", max_tokens=1, temperature=0)
    assert len(r.choices) == 1 and r.choices[0].finish_reason in ("length", "stop")


@pytest.mark.parametrize("case", list(COMPLETION_CASES), ids=list(COMPLETION_CASES))
def test_completion_value_errors_name_field_value_and_allowed(client, model_name, case):
    fields, param, message = COMPLETION_CASES[case]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model_name, **{"prompt": "Hi", "max_tokens": 2, **fields})
    assert e.value.status_code == 400
    assert e.value.body == {"message": f"{param}: {message}", "type": "invalid_request_error", "param": param,
                            "code": None}
    _valid(client, model_name)


CHAT = [{"role": "user", "content": "Hi"}]
CHAT_CASES = {
    "max_completion_tokens_1e20": ({"max_completion_tokens": 1e20}, "max_completion_tokens",
                                   "1e+20 is not an integer (allowed: integer >= 1, or null)"),
    "max_tokens_fraction": ({"max_tokens": 2.5}, "max_tokens", "2.5 is not an integer (allowed: integer >= 1, or null)"),
    "top_logprobs_fraction": ({"logprobs": True, "top_logprobs": 1.5}, "top_logprobs",
                              "1.5 is not an integer (allowed: integer in [0, 20], or null)"),
    "logprobs_text": ({"logprobs": "maybe"}, "logprobs", '"maybe" is not a boolean (allowed: true, false, or null)'),
    "role": ({"messages": [{"role": "wizard", "content": "Hi"}]}, "messages.0.role",
             '"wizard" not allowed (allowed: "system", "developer", "user", "assistant", "tool")'),
    "content": ({"messages": [{"role": "user", "content": 5}]}, "messages.0.content",  # was param "messages"
                "5 is none of str, list[ContentPart]"),
}


@pytest.mark.parametrize("case", list(CHAT_CASES), ids=list(CHAT_CASES))
def test_chat_value_errors_name_field_value_and_allowed(client, model_name, case):
    fields, param, message = CHAT_CASES[case]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model_name, **{"messages": CHAT, "max_tokens": 1, **fields})
    assert e.value.status_code == 400
    assert e.value.body == {"message": f"{param}: {message}", "type": "invalid_request_error", "param": param,
                            "code": None}
    _valid(client, model_name)


def test_several_bad_fields_are_named_in_one_message(server, client, model_name):
    r = server.post("/v1/completions", json={"prompt": "Hi", "n": 0, "max_tokens": 1e20, "stream": "maybe"})
    assert r.status_code == 400
    assert r.json() == {"error": {
        "message": 'n: 0 not allowed (allowed: integer in [1, 128]); stream: "maybe" is not a boolean (allowed: true, '
                   "false, or null); max_tokens: 1e+20 is not an integer (allowed: integer >= 1, or null)",
        "type": "invalid_request_error", "param": "n", "code": None}}
    _valid(client, model_name)
