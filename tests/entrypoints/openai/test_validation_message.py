"""The 400 message and param of a request body that fails validation (``errors.validation_message``): a value of
the wrong type or out of range names the value and what the field allows (``allowed.allowed_values``, from the
request model's schema); a field typed as a union fails once per member, and those errors read as one."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from attnserve.refusals.schema import allowed_values
from attnserve.entrypoints.openai.body import SentNumber
from attnserve.entrypoints.openai.errors import validation_message
from attnserve.entrypoints.openai.protocol import CompletionRequest
from attnserve.entrypoints.openai.protocol_chat import ChatCompletionRequest


STOP_WORDS = "a non-empty string, a list of non-empty strings, or null"


def _message(cls, body: dict) -> tuple[str, str | None]:
    with pytest.raises(ValidationError) as e:
        cls.model_validate(body)
    return validation_message(e.value.errors(), cls)


@pytest.mark.parametrize(
    "body, want",
    [
        # prompt: a string, strings, token ids or lists of token ids; -1 fits the token-id member's type, not its bound
        ({"prompt": [-1]}, ("prompt.0: -1 not allowed (allowed: integer >= 0)", "prompt.0")),
        ({"prompt": [[1, -2]]}, ("prompt.0.1: -2 not allowed (allowed: integer >= 0)", "prompt.0.1")),
        ({"prompt": [1.5]}, ("prompt.0: 1.5 is not an integer (allowed: integer >= 0)", "prompt.0")),
        # was "stop.str: ...; stop.list[str]: ...", then "stop: 5 is none of str, list[str]" (pydantic's type names)
        ({"prompt": "x", "stop": 5}, (f"stop: 5 not allowed (allowed: {STOP_WORDS})", "stop")),
        (
            {"prompt": "x", "stop": True},
            (f"stop: true not allowed (allowed: {STOP_WORDS})", "stop"),
        ),  # the value as JSON
        # an empty stop string (was accepted here, then refused by SamplingParams as "stop [''] not allowed"): the
        # union's words at its own path, the item's inside the list
        ({"prompt": "x", "stop": ""}, (f'stop: "" not allowed (allowed: {STOP_WORDS})', "stop")),
        ({"prompt": "x", "stop": ["a", ""]}, ('stop.1: "" not allowed (allowed: non-empty string)', "stop.1")),
        ({"prompt": "x", "stop": ["a", 5]}, ("stop.1: 5 is not a string (allowed: non-empty string)", "stop.1")),
        # no member fits (a boolean is not a token id): every member in words
        (
            {"prompt": [1, True]},
            (
                "prompt: [1, true] not allowed (allowed: a string, a list of strings, a list of integers "
                ">= 0, or a list of lists of integers >= 0)",
                "prompt",
            ),
        ),
        # the value as sent and the schema's range (was "Input should be a valid number, unable to parse string as a
        # number", "Unable to parse input string as an integer, exceeded maximum size", "Input should be greater than
        # or equal to 1")
        (
            {"prompt": "x", "temperature": "hot"},
            ('temperature: "hot" is not a number (allowed: number >= 0, or null)', "temperature"),
        ),
        (
            {"prompt": "x", "max_tokens": 1e20},
            ("max_tokens: 1e+20 is not an integer (allowed: integer >= 1, or null)", "max_tokens"),
        ),
        (
            {"prompt": "x", "max_tokens": 0},
            ("max_tokens: 0 not allowed (allowed: integer >= 1, or null)", "max_tokens"),
        ),
        (
            {"prompt": "x", "max_tokens": "x" * 70},
            (f'max_tokens: "{"x" * 56}... is not an integer (allowed: integer >= 1, or null)', "max_tokens"),
        ),
        (
            {"prompt": "x", "presence_penalty": 2.5},
            ("presence_penalty: 2.5 not allowed (allowed: number in [-2, 2], or null)", "presence_penalty"),
        ),
        (
            {"prompt": "x", "stream_options": {"include_usage": "maybe"}},
            (
                'stream_options.include_usage: "maybe" is not a boolean (allowed: true, false, or null)',
                "stream_options.include_usage",
            ),
        ),
        # a missing required field: what it must be, every union member in words (was "prompt: Field required")
        (
            {},
            (
                "prompt: missing (required: a string, a list of strings, a list of integers >= 0, or a list of lists of "
                "integers >= 0)",
                "prompt",
            ),
        ),
        # strict types, as OpenAI's API: no string to number, boolean to integer or 2.0 to integer
        ({"prompt": "x", "n": "2"}, ('n: "2" is not an integer (allowed: integer in [1, 128])', "n")),
        ({"prompt": "x", "n": 2.0}, ("n: 2.0 is not an integer (allowed: integer in [1, 128])", "n")),
        (
            {"prompt": "x", "max_tokens": True},
            ("max_tokens: true is not an integer (allowed: integer >= 1, or null)", "max_tokens"),
        ),
        (
            {"prompt": "x", "stop_token_ids": [False]},
            ("stop_token_ids.0: false is not an integer (allowed: integer >= 0)", "stop_token_ids.0"),
        ),
        (
            {"prompt": "x", "temperature": "0.5"},
            ('temperature: "0.5" is not a number (allowed: number >= 0, or null)', "temperature"),
        ),
        (
            {"prompt": "x", "stream": "yes"},
            ('stream: "yes" is not a boolean (allowed: true, false, or null)', "stream"),
        ),
        ({"prompt": "x", "echo": 1}, ("echo: 1 is not a boolean (allowed: true, false, or null)", "echo")),
        # JSON's 1e400 parses as infinity: body.parse_body keeps its text (a SentNumber); a plain infinity reads as
        # JSON spells it (Python's extension); NaN too
        (
            {"prompt": "x", "max_tokens": SentNumber("1e400")},
            ("max_tokens: 1e400 is beyond a 64-bit float's range (allowed: integer >= 1, or null)", "max_tokens"),
        ),
        (
            {"prompt": "x", "temperature": SentNumber("-1E+400")},
            ("temperature: -1E+400 is beyond a 64-bit float's range (allowed: number >= 0, or null)", "temperature"),
        ),
        (
            {"prompt": "x", "max_tokens": float("inf")},
            ("max_tokens: Infinity is not a finite number (allowed: integer >= 1, or null)", "max_tokens"),
        ),
        (
            {"prompt": "x", "temperature": float("-inf")},
            ("temperature: -Infinity is not a finite number (allowed: number >= 0, or null)", "temperature"),
        ),
        (
            {"prompt": "x", "top_p": float("nan")},
            ("top_p: NaN is not a number (allowed: number in (0, 1], or null)", "top_p"),
        ),
        # seed: every seed's range, in every seed's words (its x-allowed)
        (
            {"prompt": "x", "seed": 2**63},
            ("seed: 9223372036854775808 not allowed (allowed: integer in [-2^63, 2^63 - 1], or null)", "seed"),
        ),
    ],
)
def test_completion_body_errors(body, want):
    assert _message(CompletionRequest, {"model": "m", **body}) == want


def test_an_integer_is_a_number():
    """As OpenAI's API: strict types, but an integer where a number is expected is that number."""
    assert CompletionRequest.model_validate({"prompt": "x", "temperature": 1, "top_p": 1}).temperature == 1


def test_plain_nested_field_keeps_its_path():
    message, param = _message(ChatCompletionRequest, {"model": "m", "messages": [{"role": "wizard", "content": "hi"}]})
    assert (message, param) == (
        'messages.0.role: "wizard" not allowed (allowed: "system", "developer", "user", "assistant", "tool")',
        "messages.0.role",
    )


CONTENT_WORDS = 'a string, or a non-empty list of text parts {"type": "text", "text": string}'


def test_a_union_inside_a_list_is_named_by_its_own_path():
    """Was 'messages: 5 is none of str, list[ContentPart]', param messages, naming neither the message nor content."""
    body = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "user", "content": 5},
            {"role": "user", "content": True},
        ],
    }
    assert _message(ChatCompletionRequest, body) == (
        f"messages.1.content: 5 not allowed (allowed: {CONTENT_WORDS}); messages.2.content: true not allowed "
        f"(allowed: {CONTENT_WORDS})",
        "messages.1.content",
    )


@pytest.mark.parametrize(
    "body, want",
    [
        ({}, ("messages: missing (required: a non-empty list of chat messages)", "messages")),
        # content is required whatever the role: attnserve has no tool calls, the one reason OpenAI lets an
        # assistant message go without it
        (
            {"messages": [{"role": "user"}]},
            (f"messages.0.content: missing (required: {CONTENT_WORDS})", "messages.0.content"),
        ),
        (
            {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant"}]},
            (f"messages.1.content: missing (required: {CONTENT_WORDS})", "messages.1.content"),
        ),
        (
            {"messages": [{"role": "system", "content": None}]},
            (f"messages.0.content: null not allowed (allowed: {CONTENT_WORDS})", "messages.0.content"),
        ),
        (
            {"messages": [{"content": "hi"}]},
            (
                'messages.0.role: missing (required: "system", "developer", "user", "assistant", "tool")',
                "messages.0.role",
            ),
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
            ("messages.0.content.0.text: missing (required: a string)", "messages.0.content.0.text"),
        ),
    ],
)
def test_chat_missing_fields(body, want):
    assert _message(ChatCompletionRequest, {"model": "m", **body}) == want


MESSAGE_WORDS = 'an object with "role" and "content", optionally "name", "tool_calls" and "tool_call_id"'


@pytest.mark.parametrize(
    "cls, body, want",
    [
        # a list or an object where it does not belong, or a list too short: the value as sent and what the field
        # allows (was "List should have at least 1 item after validation, not 0", "Input should be a valid list",
        # "Input should be a valid dictionary or instance of ChatMessage")
        (
            ChatCompletionRequest,
            {"messages": []},
            ("messages: [] not allowed (allowed: a non-empty list of chat messages)", "messages"),
        ),
        (
            ChatCompletionRequest,
            {"messages": "hi"},
            ('messages: "hi" is not a list (allowed: a non-empty list of chat messages)', "messages"),
        ),
        (
            ChatCompletionRequest,
            {"messages": {}},
            ("messages: {} is not a list (allowed: a non-empty list of chat messages)", "messages"),
        ),
        (
            ChatCompletionRequest,
            {"messages": [1]},
            (f"messages.0: 1 is not a chat message (allowed: {MESSAGE_WORDS})", "messages.0"),
        ),
        (
            ChatCompletionRequest,
            {"messages": [[]]},
            (f"messages.0: [] is not a chat message (allowed: {MESSAGE_WORDS})", "messages.0"),
        ),
        # content [] was accepted (OpenAI's API refuses an empty list of parts)
        (
            ChatCompletionRequest,
            {"messages": [{"role": "user", "content": []}]},
            (f"messages.0.content: [] not allowed (allowed: {CONTENT_WORDS})", "messages.0.content"),
        ),
        # only the list member looks inside a list: its error (was "messages.0.content: [...] not allowed")
        (
            ChatCompletionRequest,
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, 5]}]},
            (
                'messages.0.content.1: 5 is not a text part {"type": "text", "text": string} (allowed: an object with "type" '
                'and "text")',
                "messages.0.content.1",
            ),
        ),
        (
            ChatCompletionRequest,
            {"messages": [{"role": "user", "content": "x"}], "stream_options": 5},
            (
                'stream_options: 5 is not a stream options object (allowed: an object with optional "include_usage", or null)',
                "stream_options",
            ),
        ),
        (
            ChatCompletionRequest,
            {"messages": [{"role": "user", "content": "x"}], "response_format": "json"},
            (
                'response_format: "json" is not a response format object (allowed: an object with "type", optionally "json_schema", or null)',
                "response_format",
            ),
        ),
        (
            ChatCompletionRequest,
            {"messages": [{"role": "user", "content": "x"}], "tools": 5},
            ("tools: 5 is not a list (allowed: a list of objects, or null)", "tools"),
        ),
        (
            CompletionRequest,
            {"prompt": "x", "stop_token_ids": 5},
            ("stop_token_ids: 5 is not a list (allowed: a list of integers >= 0, or null)", "stop_token_ids"),
        ),
        (
            CompletionRequest,
            {"prompt": "x", "logit_bias": [1]},
            ("logit_bias: [1] is not an object (allowed: an object of numbers, or null)", "logit_bias"),
        ),
        (
            CompletionRequest,
            {"prompt": "x", "logit_bias": {"1": "a"}},  # a mapping's value: its type (was pydantic's)
            ('logit_bias.1: "a" is not a number (allowed: number)', "logit_bias.1"),
        ),
    ],
)
def test_list_and_object_errors(cls, body, want):
    assert _message(cls, {"model": "m", **body}) == want


def test_without_the_model_pydantic_words_the_message():
    with pytest.raises(ValidationError) as e:
        CompletionRequest.model_validate({"prompt": "x", "n": 1.5})
    assert validation_message(e.value.errors()) == ("n: Input should be a valid integer", "n")


@pytest.mark.parametrize(
    "path, kinds, want",
    [
        (("n",), ("integer",), "integer in [1, 128]"),
        (("max_tokens",), ("integer",), "integer >= 1, or null"),
        (("top_p",), ("number",), "number in (0, 1], or null"),
        (("top_k",), ("integer",), "integer >= -1, or null"),
        (("echo",), ("boolean",), "true, false, or null"),
        (("prompt", 0), ("integer",), "integer >= 0"),  # the token-id member of the union, not the string one
        (("prompt", 0), ("string",), "string"),
        (("prompt", 0, 3), ("integer",), "integer >= 0"),
        (("stream_options", "include_usage"), ("boolean",), "true, false, or null"),  # through a $ref
        (("seed",), ("integer",), "integer in [-2^63, 2^63 - 1], or null"),  # its x-allowed words
        (("n",), ("string",), None),  # no member of that kind
        (("no_such_field",), ("integer",), None),
    ],
)
def test_allowed_values_from_the_schema(path, kinds, want):
    assert allowed_values(CompletionRequest, path, kinds) == want
