"""The 400 message and param of a request body that fails validation (``errors.validation_message``): a value of
the wrong type or out of range names the value and what the field allows (``allowed.allowed_values``, from the
request model's schema); a field typed as a union fails once per member, and those errors read as one."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from attnserve.entrypoints.openai.allowed import allowed_values
from attnserve.entrypoints.openai.errors import validation_message
from attnserve.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest


def _message(cls, body: dict) -> tuple[str, str | None]:
    with pytest.raises(ValidationError) as e:
        cls.model_validate(body)
    return validation_message(e.value.errors(), cls)


@pytest.mark.parametrize("body, want", [
    # prompt: a string, strings, token ids or lists of token ids; -1 fits the token-id member's type, not its bound
    ({"prompt": [-1]}, ("prompt.0: -1 not allowed (allowed: integer >= 0)", "prompt.0")),
    ({"prompt": [[1, -2]]}, ("prompt.0.1: -2 not allowed (allowed: integer >= 0)", "prompt.0.1")),
    ({"prompt": [1.5]}, ("prompt.0: 1.5 is not an integer (allowed: integer >= 0)", "prompt.0")),
    ({"prompt": "x", "stop": 5}, ("stop: 5 is none of str, list[str]", "stop")),  # was "stop.str: ...; stop.list[str]: ..."
    ({"prompt": "x", "stop": True}, ("stop: true is none of str, list[str]", "stop")),  # the value as JSON
    # the value as sent and the schema's range (was "Input should be a valid number, unable to parse string as a
    # number", "Unable to parse input string as an integer, exceeded maximum size", "Input should be greater than
    # or equal to 1")
    ({"prompt": "x", "temperature": "hot"}, ('temperature: "hot" is not a number (allowed: number >= 0, or null)',
                                             "temperature")),
    ({"prompt": "x", "max_tokens": 1e20}, ("max_tokens: 1e+20 is not an integer (allowed: integer >= 1, or null)",
                                           "max_tokens")),
    ({"prompt": "x", "max_tokens": 0}, ("max_tokens: 0 not allowed (allowed: integer >= 1, or null)", "max_tokens")),
    ({"prompt": "x", "max_tokens": "x" * 70},
     (f'max_tokens: "{"x" * 56}... is not an integer (allowed: integer >= 1, or null)', "max_tokens")),
    ({"prompt": "x", "presence_penalty": 2.5},
     ("presence_penalty: 2.5 not allowed (allowed: number in [-2, 2], or null)", "presence_penalty")),
    ({"prompt": "x", "stream_options": {"include_usage": "maybe"}},
     ('stream_options.include_usage: "maybe" is not a boolean (allowed: true, false, or null)',
      "stream_options.include_usage")),
    ({}, ("prompt: Field required", "prompt")),
])
def test_completion_body_errors(body, want):
    assert _message(CompletionRequest, {"model": "m", **body}) == want


def test_plain_nested_field_keeps_its_path():
    message, param = _message(ChatCompletionRequest, {"model": "m", "messages": [{"role": "wizard", "content": "hi"}]})
    assert (message, param) == ('messages.0.role: "wizard" not allowed (allowed: "system", "developer", "user", '
                                '"assistant", "tool")', "messages.0.role")


def test_a_union_inside_a_list_is_named_by_its_own_path():
    """Was 'messages: 5 is none of str, list[ContentPart]', param messages, naming neither the message nor content."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": 5},
                                       {"role": "user", "content": True}]}
    assert _message(ChatCompletionRequest, body) == (
        "messages.1.content: 5 is none of str, list[ContentPart]; messages.2.content: true is none of str, "
        "list[ContentPart]", "messages.1.content")


def test_without_the_model_pydantic_words_the_message():
    with pytest.raises(ValidationError) as e:
        CompletionRequest.model_validate({"prompt": "x", "n": 1.5})
    assert validation_message(e.value.errors()) == (
        "n: Input should be a valid integer, got a number with a fractional part", "n")


@pytest.mark.parametrize("path, kinds, want", [
    (("n",), ("integer",), "integer in [1, 128]"),
    (("max_tokens",), ("integer",), "integer >= 1, or null"),
    (("top_p",), ("number",), "number in (0, 1], or null"),
    (("top_k",), ("integer",), "integer >= -1, or null"),
    (("echo",), ("boolean",), "true, false, or null"),
    (("prompt", 0), ("integer",), "integer >= 0"),  # the token-id member of the union, not the string one
    (("prompt", 0), ("string",), "string"),
    (("prompt", 0, 3), ("integer",), "integer >= 0"),
    (("stream_options", "include_usage"), ("boolean",), "true, false, or null"),  # through a $ref
    (("n",), ("string",), None),  # no member of that kind
    (("no_such_field",), ("integer",), None),
])
def test_allowed_values_from_the_schema(path, kinds, want):
    assert allowed_values(CompletionRequest, path, kinds) == want
