"""The refusal records of a request body that fails validation (``errors.validation_refusals``; the server's 400 is
``validation_message``'s): a value of the wrong type or out of range names the value and what the field allows (``allowed.allowed_values``, from the
request model's schema); a field typed as a union fails once per member, and those errors read as one."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from attnserve.refusals import MISSING, json_value
from attnserve.refusals.schema import allowed_values
from attnserve.entrypoints.openai.body import SentNumber
from attnserve.entrypoints.openai.errors import validation_message, validation_refusals
from attnserve.entrypoints.openai.protocol import CompletionRequest
from attnserve.entrypoints.openai.protocol_chat import ChatCompletionRequest


STOP_WORDS = "a non-empty string, a list of non-empty strings, or null"


def _message(cls, body: dict) -> tuple[str, str | None]:
    with pytest.raises(ValidationError) as e:
        cls.model_validate(body)
    return validation_message(e.value.errors(), cls)


def _refused(cls, body: dict) -> list[tuple[tuple, str, str | None]]:
    """The records of the refusal of ``body``: (path, the value as sent in JSON or ``missing``, allowed) each."""
    with pytest.raises(ValidationError) as e:
        cls.model_validate(body)
    return [
        (r.path, "missing" if r.value is MISSING else json_value(r.value), r.allowed)
        for r in validation_refusals(e.value.errors(), cls)
    ]


@pytest.mark.parametrize(
    "body, want",
    [
        # prompt: a string, strings, token ids or lists of token ids; -1 fits the token-id member's type, not its bound
        ({"prompt": [-1]}, (("prompt", 0), "-1", "integer >= 0")),
        ({"prompt": [[1, -2]]}, (("prompt", 0, 1), "-2", "integer >= 0")),
        ({"prompt": [1.5]}, (("prompt", 0), "1.5", "integer >= 0")),
        # was "stop.str: ...; stop.list[str]: ...", then "stop: 5 is none of str, list[str]" (pydantic's type names)
        ({"prompt": "x", "stop": 5}, (("stop",), "5", STOP_WORDS)),
        (
            {"prompt": "x", "stop": True},
            (("stop",), "true", STOP_WORDS),
        ),  # the value as JSON
        # an empty stop string (was accepted here, then refused by SamplingParams as "stop [''] not allowed"): the
        # union's words at its own path, the item's inside the list
        ({"prompt": "x", "stop": ""}, (("stop",), '""', STOP_WORDS)),
        ({"prompt": "x", "stop": ["a", ""]}, (("stop", 1), '""', "non-empty string")),
        ({"prompt": "x", "stop": ["a", 5]}, (("stop", 1), "5", "non-empty string")),
        # no member fits (a boolean is not a token id): every member in words
        (
            {"prompt": [1, True]},
            (
                ("prompt",),
                "[1, true]",
                "a string, a list of strings, a list of integers >= 0, or a list of lists of integers >= 0",
            ),
        ),
        # the value as sent and the schema's range (was "Input should be a valid number, unable to parse string as a
        # number", "Unable to parse input string as an integer, exceeded maximum size", "Input should be greater than
        # or equal to 1")
        (
            {"prompt": "x", "temperature": "hot"},
            (("temperature",), '"hot"', "number >= 0, or null"),
        ),
        (
            {"prompt": "x", "max_tokens": 1e20},
            (("max_tokens",), "1e+20", "integer >= 1, or null"),
        ),
        (
            {"prompt": "x", "max_tokens": 0},
            (("max_tokens",), "0", "integer >= 1, or null"),
        ),
        (
            {"prompt": "x", "max_tokens": "x" * 70},
            (("max_tokens",), '"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...', "integer >= 1, or null"),
        ),
        (
            {"prompt": "x", "presence_penalty": 2.5},
            (("presence_penalty",), "2.5", "number in [-2, 2], or null"),
        ),
        (
            {"prompt": "x", "stream_options": {"include_usage": "maybe"}},
            (("stream_options", "include_usage"), '"maybe"', "true, false, or null"),
        ),
        # a missing required field: what it must be, every union member in words (was "prompt: Field required")
        (
            {},
            (
                ("prompt",),
                "missing",
                "a string, a list of strings, a list of integers >= 0, or a list of lists of integers >= 0",
            ),
        ),
        # strict types, as OpenAI's API: no string to number, boolean to integer or 2.0 to integer
        ({"prompt": "x", "n": "2"}, (("n",), '"2"', "integer in [1, 128]")),
        ({"prompt": "x", "n": 2.0}, (("n",), "2.0", "integer in [1, 128]")),
        (
            {"prompt": "x", "max_tokens": True},
            (("max_tokens",), "true", "integer >= 1, or null"),
        ),
        (
            {"prompt": "x", "stop_token_ids": [False]},
            (("stop_token_ids", 0), "false", "integer >= 0"),
        ),
        (
            {"prompt": "x", "temperature": "0.5"},
            (("temperature",), '"0.5"', "number >= 0, or null"),
        ),
        (
            {"prompt": "x", "stream": "yes"},
            (("stream",), '"yes"', "true, false, or null"),
        ),
        ({"prompt": "x", "echo": 1}, (("echo",), "1", "true, false, or null")),
        # JSON's 1e400 parses as infinity: body.parse_body keeps its text (a SentNumber); a plain infinity reads as
        # JSON spells it (Python's extension); NaN too
        (
            {"prompt": "x", "max_tokens": SentNumber("1e400")},
            (("max_tokens",), "1e400", "integer >= 1, or null"),
        ),
        (
            {"prompt": "x", "temperature": SentNumber("-1E+400")},
            (("temperature",), "-1E+400", "number >= 0, or null"),
        ),
        (
            {"prompt": "x", "max_tokens": float("inf")},
            (("max_tokens",), "Infinity", "integer >= 1, or null"),
        ),
        (
            {"prompt": "x", "temperature": float("-inf")},
            (("temperature",), "-Infinity", "number >= 0, or null"),
        ),
        (
            {"prompt": "x", "top_p": float("nan")},
            (("top_p",), "NaN", "number in (0, 1], or null"),
        ),
        # seed: every seed's range, in every seed's words (its x-allowed)
        (
            {"prompt": "x", "seed": 2**63},
            (("seed",), "9223372036854775808", "integer in [-2^63, 2^63 - 1], or null"),
        ),
    ],
)
def test_completion_body_errors(body, want):
    assert _refused(CompletionRequest, {"model": "m", **body}) == [want]


def test_an_integer_is_a_number():
    """As OpenAI's API: strict types, but an integer where a number is expected is that number."""
    assert CompletionRequest.model_validate({"prompt": "x", "temperature": 1, "top_p": 1}).temperature == 1


def test_plain_nested_field_keeps_its_path():
    assert _refused(ChatCompletionRequest, {"model": "m", "messages": [{"role": "wizard", "content": "hi"}]}) == [
        (("messages", 0, "role"), '"wizard"', '"system", "developer", "user", "assistant", "tool"')
    ]


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
    assert _refused(ChatCompletionRequest, body) == [
        (("messages", 1, "content"), "5", CONTENT_WORDS),
        (("messages", 2, "content"), "true", CONTENT_WORDS),
    ]
    assert _message(ChatCompletionRequest, body)[1] == "messages.1.content"  # param: the first field's path


@pytest.mark.parametrize(
    "body, want",
    [
        ({}, (("messages",), "missing", "a non-empty list of chat messages")),
        # content is required whatever the role: attnserve has no tool calls, the one reason OpenAI lets an
        # assistant message go without it
        (
            {"messages": [{"role": "user"}]},
            (("messages", 0, "content"), "missing", CONTENT_WORDS),
        ),
        (
            {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant"}]},
            (("messages", 1, "content"), "missing", CONTENT_WORDS),
        ),
        (
            {"messages": [{"role": "system", "content": None}]},
            (("messages", 0, "content"), "null", CONTENT_WORDS),
        ),
        (
            {"messages": [{"content": "hi"}]},
            (("messages", 0, "role"), "missing", '"system", "developer", "user", "assistant", "tool"'),
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
            (("messages", 0, "content", 0, "text"), "missing", "a string"),
        ),
    ],
)
def test_chat_missing_fields(body, want):
    assert _refused(ChatCompletionRequest, {"model": "m", **body}) == [want]


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
            (("messages",), "[]", "a non-empty list of chat messages"),
        ),
        (
            ChatCompletionRequest,
            {"messages": "hi"},
            (("messages",), '"hi"', "a non-empty list of chat messages"),
        ),
        (
            ChatCompletionRequest,
            {"messages": {}},
            (("messages",), "{}", "a non-empty list of chat messages"),
        ),
        (
            ChatCompletionRequest,
            {"messages": [1]},
            (("messages", 0), "1", MESSAGE_WORDS),
        ),
        (
            ChatCompletionRequest,
            {"messages": [[]]},
            (("messages", 0), "[]", MESSAGE_WORDS),
        ),
        # content [] was accepted (OpenAI's API refuses an empty list of parts)
        (
            ChatCompletionRequest,
            {"messages": [{"role": "user", "content": []}]},
            (("messages", 0, "content"), "[]", CONTENT_WORDS),
        ),
        # only the list member looks inside a list: its error (was "messages.0.content: [...] not allowed")
        (
            ChatCompletionRequest,
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, 5]}]},
            (("messages", 0, "content", 1), "5", 'an object with "type" and "text"'),
        ),
        (
            ChatCompletionRequest,
            {"messages": [{"role": "user", "content": "x"}], "stream_options": 5},
            (("stream_options",), "5", 'an object with optional "include_usage" and "continuous_usage_stats", or null'),
        ),
        (
            ChatCompletionRequest,
            {"messages": [{"role": "user", "content": "x"}], "response_format": "json"},
            (("response_format",), '"json"', 'an object with "type", optionally "json_schema", or null'),
        ),
        (
            ChatCompletionRequest,
            {"messages": [{"role": "user", "content": "x"}], "tools": 5},
            (("tools",), "5", "a list of objects, or null"),
        ),
        (
            CompletionRequest,
            {"prompt": "x", "stop_token_ids": 5},
            (("stop_token_ids",), "5", "a list of integers >= 0, or null"),
        ),
        (
            CompletionRequest,
            {"prompt": "x", "logit_bias": [1]},
            (("logit_bias",), "[1]", "an object of numbers, or null"),
        ),
        (
            CompletionRequest,
            {"prompt": "x", "logit_bias": {"1": "a"}},  # a mapping's value: its type (was pydantic's)
            (("logit_bias", "1"), '"a"', "number"),
        ),
    ],
)
def test_list_and_object_errors(cls, body, want):
    assert _refused(cls, {"model": "m", **body}) == [want]


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
