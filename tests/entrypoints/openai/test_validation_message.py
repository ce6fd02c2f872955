"""The 400 message and param of a request body that fails validation (``errors.validation_message``): a field
typed as a union fails once per member, and those errors read as one."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from attnserve.entrypoints.openai.errors import validation_message
from attnserve.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest


def _message(cls, body: dict) -> tuple[str, str | None]:
    with pytest.raises(ValidationError) as e:
        cls.model_validate(body)
    return validation_message(e.value.errors())


@pytest.mark.parametrize("body, want", [
    # prompt: a string, strings, token ids or lists of token ids; -1 fits the token-id member's type, not its bound
    ({"prompt": [-1]}, ("prompt.0: Input should be greater than or equal to 0", "prompt.0")),
    ({"prompt": [[1, -2]]}, ("prompt.0.1: Input should be greater than or equal to 0", "prompt.0.1")),
    ({"prompt": "x", "stop": 5}, ("stop: 5 is none of str, list[str]", "stop")),  # was "stop.str: ...; stop.list[str]: ..."
    ({"prompt": "x", "temperature": "hot"},
     ("temperature: Input should be a valid number, unable to parse string as a number", "temperature")),
    ({}, ("prompt: Field required", "prompt")),
])
def test_completion_body_errors(body, want):
    assert _message(CompletionRequest, {"model": "m", **body}) == want


def test_plain_nested_field_keeps_its_path():
    message, param = _message(ChatCompletionRequest, {"model": "m", "messages": [{"role": "wizard", "content": "hi"}]})
    assert param == "messages.0.role" and message.startswith("messages.0.role: Input should be 'system'")
