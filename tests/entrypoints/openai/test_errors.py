"""Each invalid request gets its status and OpenAI's error body, and the next valid request succeeds."""

from __future__ import annotations

import openai
import pytest

from tests.entrypoints.openai.conftest import MAX_MODEL_LEN
from tests.entrypoints.openai.utils import assert_refused


def _valid(client, model_name) -> None:
    r = client.completions.create(model=model_name, prompt="Hi", max_tokens=1, temperature=0)
    assert len(r.choices) == 1 and r.choices[0].finish_reason in ("length", "stop")


LONG = "hello " * (MAX_MODEL_LEN + 10)

BAD_COMPLETIONS = {
    "prompt_longer_than_context": dict(prompt=LONG),
    "prompt_plus_max_tokens_too_long": dict(prompt="hello " * (MAX_MODEL_LEN - 20), max_tokens=100),
    "max_tokens_0": dict(max_tokens=0),
    "max_tokens_negative": dict(max_tokens=-3),
    "temperature_negative": dict(temperature=-1.0),
    "top_p_0": dict(top_p=0.0),
    "n_0": dict(n=0),
    "logprobs_too_many": dict(logprobs=21),
    "empty_stop_string": dict(stop=[""]),
    "empty_prompt_list": dict(prompt=[]),
    "token_id_out_of_vocab": dict(prompt=[1, 10**9]),
    "echo_with_logprobs": dict(echo=True, logprobs=1),
    "frequency_penalty_out_of_range": dict(frequency_penalty=2.5),
    "prompt_logprobs_with_stream": dict(stream=True, extra_body={"prompt_logprobs": 1}),
    "stream_options_without_stream": dict(stream_options={"include_usage": True}),
    "truncate_prompt_tokens_over_max_model_len": dict(extra_body={"truncate_prompt_tokens": MAX_MODEL_LEN + 1}),
}


@pytest.mark.parametrize("case", list(BAD_COMPLETIONS), ids=list(BAD_COMPLETIONS))
def test_bad_completion_is_400(client, model_name, case):
    kw = {"model": model_name, "prompt": "Hi", "max_tokens": 2, **BAD_COMPLETIONS[case]}
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(**kw)
    assert e.value.status_code == 400
    error = e.value.body  # the client unwraps {"error": {...}}
    assert error["type"] == "invalid_request_error" and error["message"]
    _valid(client, model_name)


def test_context_length_message_names_the_numbers(client, model_name):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model_name, prompt="hello " * (MAX_MODEL_LEN - 20), max_tokens=100)
    assert f"maximum context length is {MAX_MODEL_LEN}" in e.value.body["message"]


def test_stream_options_without_stream_names_the_parameter(client, model_name):
    """As OpenAI and vLLM: stream_options only goes with stream: true (not silently ignored)."""
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model_name, prompt="Hi", max_tokens=1, stream_options={"include_usage": True})
    assert e.value.body["message"] == "stream_options is only allowed with stream: true"
    assert e.value.body["param"] == "stream_options"


@pytest.mark.parametrize("endpoint", ["/v1/completions", "/v1/chat/completions"])
def test_continuous_usage_stats_is_refused_not_ignored(server, model_name, endpoint):
    """vLLM's stream_options.continuous_usage_stats (usage in every chunk) is not implemented: true is a 400 naming
    it (was: dropped without a word); false is what runs."""
    body = {"model": model_name, "max_tokens": 1, "stream": True}
    body.update(
        {"prompt": "Hi"} if endpoint == "/v1/completions" else {"messages": [{"role": "user", "content": "Hi"}]}
    )
    r = server.post(endpoint, json={**body, "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "stream_options.continuous_usage_stats"
    r = server.post(endpoint, json={**body, "stream_options": {"include_usage": True, "continuous_usage_stats": False}})
    assert r.status_code == 200 and '"usage": {' in r.text, r.text


def test_prompt_longer_than_context_message_names_the_prompt(client, model_name, default_tokenizer):
    """A prompt that alone overflows the context: the message and param name the prompt, whatever max_tokens asked
    for (was param max_tokens, and "you requested N + 7 tokens (N in the prompt, 7 in the completion). Please reduce
    the length of the prompt or completion.": a shorter completion would not have helped)."""
    n = len(default_tokenizer.encode(LONG))
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model_name, prompt=LONG, max_tokens=7)
    assert e.value.body["message"] == (
        f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, the prompt has {n} tokens, which "
        f"leaves no room for the completion (at most {MAX_MODEL_LEN - 1} prompt tokens fit). Please raise max_model_len "
        "or reduce the length of the prompt."
    )
    assert e.value.body["param"] == "prompt"


def test_unknown_model_is_404(client, model_name):
    """OpenAI's API and vLLM answer a model they do not serve with 404 (code model_not_found)."""
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="no-such-model", prompt="Hi", max_tokens=1)
    assert e.value.status_code == 404
    assert e.value.body == {
        "message": f"model 'no-such-model' does not exist (served: {model_name})",
        "type": "not_found_error",
        "param": "model",
        "code": "model_not_found",
    }
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "Hi"}])
    _valid(client, model_name)
    _valid(client, model_name)


def test_bad_chat_is_400(client, model_name):
    for kw in (
        dict(messages=[]),
        dict(max_tokens=0),
        dict(top_logprobs=2),
        dict(messages=[{"role": "wizard", "content": "Hi"}]),
        dict(stream_options={"include_usage": True}),
    ):
        kw = {"model": model_name, "messages": [{"role": "user", "content": "Hi"}], **kw}
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(**kw)
    _valid(client, model_name)


@pytest.mark.parametrize("body", [b"{not json", b"", b"[1, 2]", b'{"prompt": "Hi", "max_tokens": NaN}'])
def test_malformed_json_is_400(server, client, model_name, body):
    r = server.post("/v1/completions", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"
    _valid(client, model_name)


def test_malformed_json_names_the_problem_not_a_parameter(server):
    r = server.post(
        "/v1/completions", content=b'{"prompt": "Hi", "max_tokens": ', headers={"Content-Type": "application/json"}
    )
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] is None
    assert err["message"] == "malformed JSON body: Expecting value at line 1, column 32 (character 31)"


def test_malformed_json_on_a_later_line_names_line_and_column(server, client, model_name):
    r = server.post(
        "/v1/completions",
        content=b'{\n  "prompt": "Hi",\n  "max_tokens": 1,\n}',
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 400
    assert r.json() == {
        "error": {
            "message": "malformed JSON body: Expecting property name enclosed in double quotes at line 4, column 1 "
            "(character 39)",
            "type": "invalid_request_error",
            "param": None,
            "code": None,
        }
    }
    _valid(client, model_name)


# bodies Python's JSON parser refuses with no JSONDecodeError: FastAPI's "There was an error parsing the body"
# (and for 10000 nested arrays its RecursionError); now each a 400 that says what is wrong (body.parse_body)
UNREADABLE = {
    "latin1": (
        b'{"prompt": "caf\xe9"}',
        "the request body is not valid UTF-8 (byte 0xe9 at offset 15: invalid continuation byte); send JSON "
        "encoded as UTF-8",
    ),
    "cut_utf8": (
        b'{"prompt": "\xe2\x82',
        "the request body is not valid UTF-8 (byte 0xe2 at offset 12: unexpected end of data); send JSON "
        "encoded as UTF-8",
    ),
    "nested_10000": (
        b'{"prompt": ' + b"[" * 10000 + b"]" * 10000 + b"}",
        "the request body nests arrays and objects 10001 levels deep (allowed: at most 100)",
    ),
    "nested_unclosed": (
        b"[" * 5000,
        "the request body nests arrays and objects 5000 levels deep (allowed: at most 100)",
    ),
    "nested_objects": (
        b'{"a": ' * 200 + b"1" + b"}" * 200,
        "the request body nests arrays and objects 200 levels deep (allowed: at most 100)",
    ),
    "integer_5000_digits": (
        b'{"prompt": "Hi", "max_tokens": 1' + b"0" * 5000 + b"}",
        "the request body holds an integer of more than 4300 digits, more than any field allows",
    ),
    # a lone surrogate escape: read by the parser, then a 500 from the tokenizer (found by a fresh-user trial)
    "lone_surrogate_prompt": (
        b'{"prompt": "hi\\ud800"}',
        'prompt: "hi\\ud800" holds a lone surrogate \\ud800 at index 2 (allowed: Unicode text; '
        "a surrogate escape needs its pair)",
    ),
    "lone_surrogate_in_a_message": (
        b'{"messages": [{"role": "user", "content": "\\udc00"}]}',
        'messages.0.content: "\\udc00" holds a lone surrogate \\udc00 at index 0 '
        "(allowed: Unicode text; a surrogate escape needs its pair)",
    ),
    # the stop list too (a fresh-user trial reported pydantic's wording for it), and a stop string
    "lone_surrogate_in_the_stop_list": (
        b'{"prompt": "Hi", "stop": ["\\ud800"]}',
        'stop.0: "\\ud800" holds a lone surrogate \\ud800 at index 0 (allowed: Unicode '
        "text; a surrogate escape needs its pair)",
    ),
    # an upper-case escape is the same character (the body's text is searched for such escapes before the walk)
    "lone_surrogate_upper_case": (
        b'{"prompt": "x\\uDBFF"}',
        'prompt: "x\\udbff" holds a lone surrogate \\udbff at index 1 (allowed: Unicode text; '
        "a surrogate escape needs its pair)",
    ),
    "lone_surrogate_stop_string": (
        b'{"prompt": "Hi", "stop": "ab\\udfff"}',
        'stop: "ab\\udfff" holds a lone surrogate \\udfff at index 2 (allowed: Unicode text; '
        "a surrogate escape needs its pair)",
    ),
    # a UTF-16 BOM (FF FE, or FE FF) before UTF-8 JSON, or alone: as any other body that is not UTF-8 (was "malformed
    # JSON body: Expecting value at line 1, column 1": Python's parser read the bytes as UTF-16; found by a fresh-user
    # trial). JSON that is UTF-16 throughout is still read (test_utf16_body_is_read_as_before)
    "utf16_bom_then_utf8": (
        b'\xff\xfe{"prompt": "Hi", "max_tokens": 1}',
        "the request body is not valid UTF-8 (byte 0xff at offset 0: invalid start byte); send JSON encoded as UTF-8",
    ),
    "utf16_bom_odd_length": (
        b'\xff\xfe{"prompt": "Hi"}x',  # (was "not valid UTF-16 (byte 0x78 at offset 18: ...)")
        "the request body is not valid UTF-8 (byte 0xff at offset 0: invalid start byte); send JSON encoded as UTF-8",
    ),
    "utf16_bom_alone": (
        b"\xff\xfe",
        "the request body is not valid UTF-8 (byte 0xff at offset 0: invalid start byte); send JSON encoded as UTF-8",
    ),
    "utf16_be_bom_then_utf8": (
        b'\xfe\xff{"prompt": "Hi"}',
        "the request body is not valid UTF-8 (byte 0xfe at offset 0: invalid start byte); send JSON encoded as UTF-8",
    ),
    # after a UTF-8 BOM, the offset in the body as sent (was "byte 0x63 at offset 15": the offset after the BOM)
    "utf8_bom_then_latin1": (
        b'\xef\xbb\xbf{"prompt": "caf\xe9"}',
        "the request body is not valid UTF-8 (byte 0xe9 at offset 18: invalid continuation byte); "
        "send JSON encoded as UTF-8",
    ),
    "utf32_bom_then_utf8": (
        b'\xff\xfe\x00\x00{"prompt": "Hi"}',
        "the request body is not valid UTF-8 (byte 0xff at offset 0: invalid start byte); send JSON encoded as UTF-8",
    ),
}


# the field a refused string sits in, as every other field's 400 names it (was None; found by a fresh-user trial);
# the other cases are about the body as a whole
UNREADABLE_PARAM = {
    "lone_surrogate_prompt": "prompt",
    "lone_surrogate_in_a_message": "messages.0.content",
    "lone_surrogate_in_the_stop_list": "stop.0",
    "lone_surrogate_upper_case": "prompt",
    "lone_surrogate_stop_string": "stop",
}


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"], ids=["completion", "chat"])
@pytest.mark.parametrize("case", list(UNREADABLE), ids=list(UNREADABLE))
def test_body_python_cannot_read_is_400_saying_why(server, client, model_name, case, path):
    body, message = UNREADABLE[case]
    r = server.post(path, content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    param = UNREADABLE_PARAM.get(case)
    assert r.json() == {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": None}}
    _valid(client, model_name)


def test_brackets_in_strings_and_nesting_up_to_the_limit_are_read(server):
    """Brackets inside a string are text; 100 levels (the body object and 99 arrays) are read (an unknown field
    is ignored)."""
    r = server.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1, "x": '[{"\\' * 300})
    assert r.status_code == 200, r.text
    r = server.post(
        "/v1/completions",
        content=b'{"prompt": "Hi", "x": ' + b"[" * 99 + b"]" * 99 + b"}",
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 200, r.text
    r = server.post(
        "/v1/completions",
        content=b'{"prompt": "Hi", "x": ' + b"[" * 100 + b"]" * 100 + b"}",
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 400 and "101 levels deep" in r.json()["error"]["message"]


def test_utf16_body_is_read_as_before(server):
    """Python's parser reads UTF-16 and UTF-32 (by their first bytes) and a UTF-8 BOM; so does the server still."""
    text = '{"prompt": "Hi", "max_tokens": 1}'
    for body in (
        text.encode("utf-16"),
        text.encode("utf-32"),
        b"\xef\xbb\xbf" + text.encode(),
        text.encode("utf-16-be"),
        text.encode("utf-16-le"),
    ):
        r = server.post("/v1/completions", content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 200, r.text


SENT_AS_JSON = "the request body must be a JSON object sent with 'Content-Type: application/json'"
# a body that is not a JSON object (was "body: Input should be a valid dictionary or object to extract fields
# from", and "body: Field required" for an empty one)
NOT_AN_OBJECT = {
    # curl -d's default Content-Type: FastAPI reads a body as JSON only when it is sent as JSON
    "form_content_type": (
        b'{"prompt": "Hi"}',
        {"Content-Type": "application/x-www-form-urlencoded"},
        f"{SENT_AS_JSON} (got 'Content-Type: application/x-www-form-urlencoded')",
    ),
    "text_content_type": (
        b'{"prompt": "Hi"}',
        {"Content-Type": "text/plain"},
        f"{SENT_AS_JSON} (got 'Content-Type: text/plain')",
    ),
    "no_content_type": (b'{"prompt": "Hi"}', {}, f"{SENT_AS_JSON} (got no Content-Type header)"),
    "array": (
        b"[1]",
        {"Content-Type": "application/json"},
        "the request body must be a JSON object, got an array: [1]",
    ),
    "string": (
        b'"x"',
        {"Content-Type": "application/json"},
        'the request body must be a JSON object, got a string: "x"',
    ),
    "number": (b"3", {"Content-Type": "application/json"}, "the request body must be a JSON object, got a number: 3"),
    "null": (b"null", {"Content-Type": "application/json"}, "the request body must be a JSON object, got null"),
    "empty": (
        b"",
        {"Content-Type": "application/json"},
        "the request body is empty; it must be a JSON object (sent with 'Content-Type: application/json')",
    ),
}


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"], ids=["completion", "chat"])
@pytest.mark.parametrize("case", list(NOT_AN_OBJECT), ids=list(NOT_AN_OBJECT))
def test_body_that_is_not_a_json_object(server, client, model_name, case, path):
    body, headers, message = NOT_AN_OBJECT[case]
    r = server.post(path, content=body, headers=headers)
    assert r.status_code == 400
    assert r.json() == {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}}
    _valid(client, model_name)


def test_unknown_route_is_404_in_openai_format(server, client, model_name):
    r = server.get("/v1/nothing-here")
    assert r.status_code == 404 and r.json()["error"]["message"]
    _valid(client, model_name)


CHAT = [{"role": "user", "content": "Hi"}]


def _valid_chat(client, model_name) -> None:
    r = client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=1, temperature=0)
    assert len(r.choices) == 1 and r.choices[0].finish_reason in ("length", "stop")


@pytest.mark.parametrize(
    "path,body",
    [
        ("/v1/chat/completions", {"messages": CHAT}),
        ("/v1/completions", {"prompt": "Hi"}),
    ],
    ids=["chat", "completion"],
)
@pytest.mark.parametrize("response_format", [None, {"type": "text"}], ids=["null", "text"])
def test_response_format_text_or_null_is_accepted(server, path, body, response_format):
    r = server.post(path, json={**body, "max_tokens": 1, "temperature": 0, "response_format": response_format})
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == 1


def test_vllm_structured_output_fields_null_are_accepted(server):
    r = server.post(
        "/v1/completions",
        json={
            "prompt": "Hi",
            "max_tokens": 1,
            "temperature": 0,
            "guided_json": None,
            "guided_regex": None,
            "guided_choice": None,
            "guided_grammar": None,
            "structured_outputs": None,
        },
    )
    assert r.status_code == 200, r.text


TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}
AUTO = '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
# OpenAI's deprecated functions / function_call are refused (as vLLM); tool_choice without tools, and "auto" (the
# default with tools) on a server started without --enable-auto-tool-choice, are refused (tests/entrypoints/openai/
# test_tool_calls.py has what tool calling does)
REFUSED_TOOL_FIELDS = {
    "functions": (
        dict(functions=[TOOL["function"]]),
        "functions",
        ('["get_weather"]', "absent, null or []"),
    ),
    "function_call_auto": (
        dict(extra_body={"function_call": "auto"}),
        "function_call",
        ('"auto"', 'absent, null or "none"'),
    ),
    "tools_auto_by_default": (dict(tools=[TOOL]), "tool_choice", AUTO),
    "tool_choice_auto": (dict(tools=[TOOL], tool_choice="auto"), "tool_choice", AUTO),
    "tool_choice_required_without_tools": (
        dict(tool_choice="required"),
        "tool_choice",
        ('"required"', None),
    ),
    # the value as sent, an object (was the object's JSON in a JSON string: "{\\"type\\":\\"function\\", ...}")
    "tool_choice_named_without_tools": (
        dict(tool_choice={"type": "function", "function": {"name": "x"}}),
        "tool_choice",
        ('{"type": "function", "function": {"name": "x"}}', None),
    ),
    "tool_choice_named_not_a_tool": (
        dict(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "x"}}),
        "tool_choice",
        ('"x"', "'get_weather'"),
    ),
}


@pytest.mark.parametrize("case", list(REFUSED_TOOL_FIELDS), ids=list(REFUSED_TOOL_FIELDS))
def test_chat_tool_calling_refusals_are_400(client, model_name, case):
    fields, param, message = REFUSED_TOOL_FIELDS[case]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=1, **fields)
    assert e.value.status_code == 400
    if isinstance(message, tuple):  # the value as sent, what is allowed
        assert_refused(e.value.body, param, *message)
    else:  # vLLM's own words
        assert e.value.body == {"message": message, "type": "invalid_request_error", "param": param, "code": None}
    _valid_chat(client, model_name)


def test_chat_streamed_tool_calling_refusal_is_400(client, model_name):
    """Refused before the stream starts: a 400, not a 200 with an error event."""
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=1, stream=True, tools=[TOOL])
    assert e.value.status_code == 400 and e.value.body["param"] == "tool_choice"
    _valid_chat(client, model_name)


@pytest.mark.parametrize(
    "fields",
    [
        dict(tools=[]),
        dict(functions=[]),
        dict(tools=None, functions=None, tool_choice=None),
        dict(tool_choice="none"),
        dict(tools=[TOOL], tool_choice="none"),
        dict(function_call="none"),
        # other fields attnserve does not know are still ignored, as in vLLM
        dict(parallel_tool_calls=False, store=False, metadata={"k": "v"}, no_such_field=1),
    ],
    ids=[
        "tools_empty",
        "functions_empty",
        "all_null",
        "tool_choice_none",
        "tools_with_tool_choice_none",
        "function_call_none",
        "unknown_fields",
    ],
)
def test_chat_without_tool_calling_is_accepted(server, fields):
    r = server.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 1, "temperature": 0, **fields})
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == 1
