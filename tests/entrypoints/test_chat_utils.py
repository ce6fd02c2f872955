"""chat_utils.chat_messages (LLM.chat's checks) says what the server says for the same bad messages: the same place
(the server's param) and the same words, the value spelled as JSON; checked offline, against the server's request
schema and its validation messages (no server needed)."""

from __future__ import annotations

import pydantic
import pytest

from attnserve.engine.request_checks import RequestValueError
from attnserve.entrypoints.chat_utils import chat_messages
from attnserve.entrypoints.openai.errors import validation_message
from attnserve.refusals import openai_error
from attnserve.entrypoints.openai.protocol_chat import ChatCompletionRequest

HI = {"role": "user", "content": "Hi"}
BAD_MESSAGES = {
    "string": "hi",
    "object": HI,
    "empty": [],
    "message_number": [1],
    "message_list": [[HI]],
    "role_missing": [{"content": "Hi"}],
    "role_unknown": [HI, {"role": "bot", "content": "x"}],
    "content_missing": [HI, {"role": "assistant"}],
    "content_null": [{"role": "user", "content": None}],
    "content_number": [{"role": "user", "content": 5}],
    "content_empty_list": [{"role": "user", "content": []}],
    "part_number": [{"role": "user", "content": [{"type": "text", "text": "Hi"}, 5]}],
    "part_type": [{"role": "user", "content": [{"type": "image_url"}]}],
    "part_type_missing": [{"role": "user", "content": [{"text": "Hi"}]}],
    "part_text_missing": [{"role": "user", "content": [{"type": "text"}]}],
    "part_text_number": [{"role": "user", "content": [{"type": "text", "text": 5}]}],
}


@pytest.mark.parametrize("case", list(BAD_MESSAGES), ids=list(BAD_MESSAGES))
def test_chat_messages_refuse_as_the_server_does(case):
    messages = BAD_MESSAGES[case]
    with pytest.raises(pydantic.ValidationError) as server:
        ChatCompletionRequest.model_validate({"messages": messages})
    message, param = validation_message(server.value.errors(), ChatCompletionRequest)
    with pytest.raises(RequestValueError) as e:
        chat_messages(messages)
    assert openai_error(e.value.refusal) == (message, param)


def test_a_name_that_is_no_string_is_refused_with_python_words():
    """The one difference: Python's None where the server's JSON says null."""
    with pytest.raises(RequestValueError) as e:
        chat_messages([{**HI, "name": 3}])
    assert str(e.value) == "messages[0].name 3 is not a string (allowed: string, or None)"
    with pytest.raises(pydantic.ValidationError) as server:
        ChatCompletionRequest.model_validate({"messages": [{**HI, "name": 3}]})
    assert validation_message(server.value.errors(), ChatCompletionRequest) == (
        "messages.0.name: 3 is not a string (allowed: string, or null)",
        "messages.0.name",
    )
