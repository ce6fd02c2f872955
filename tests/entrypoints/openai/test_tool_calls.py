"""Tool calling over HTTP with the openai client: tool_choice required and a named function (constrained by the
tools' schemas), auto with the hermes parser, streamed and not; the chat template receives the tools."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from tests.entrypoints.openai.conftest import SERVER_ARGS
from tests.entrypoints.openai.utils import RemoteServer

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("xgrammar")

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"zone": {"enum": ["UTC", "CET"]}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather forecast", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
]
SCHEMA_OF = {"get_weather": WEATHER, "get_time": TIME}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris for 3 days?"}]
# a hermes tool call, forced by a regex, so that the auto parser has one to find with a model that writes none
HERMES_REGEX = (
    r'Sure\. <tool_call>\n\{"name": "get_weather", "arguments": \{"city": "[A-Z][a-z]{2,8}", '
    r'"days": [1-7]\}\}\n</tool_call>'
)


def _streamed(stream) -> tuple[str, dict[int, dict], str]:
    """(content, tool calls by index as the client accumulates them, finish reason) of a stream."""
    content, calls, finish = "", {}, None
    for chunk in stream:
        if not chunk.choices:
            continue
        ch = chunk.choices[0]
        content += ch.delta.content or ""
        for d in ch.delta.tool_calls or []:
            call = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
            if d.id:
                call["id"] = d.id
            call["name"] += d.function.name or ""
            call["arguments"] += d.function.arguments or ""
        finish = ch.finish_reason or finish
    return content, calls, finish


def _check_calls(calls: list[tuple[str, str]]) -> None:
    assert calls
    for name, arguments in calls:
        jsonschema.validate(json.loads(arguments), SCHEMA_OF[name])


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_named_function(client, model_name, stream):
    kw = dict(
        model=model_name,
        messages=MESSAGES,
        tools=TOOLS,
        max_tokens=60,
        temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    if stream:
        content, calls, finish = _streamed(client.chat.completions.create(stream=True, **kw))
        assert content == "" and list(calls) == [0] and calls[0]["id"]
        _check_calls([(calls[0]["name"], calls[0]["arguments"])])
    else:
        c = client.chat.completions.create(**kw).choices[0]
        assert c.message.content is None and len(c.message.tool_calls) == 1 and c.message.tool_calls[0].id
        finish = c.finish_reason
        _check_calls([(t.function.name, t.function.arguments) for t in c.message.tool_calls])
    assert finish == "stop"  # OpenAI's for a named function


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_required(client, model_name, stream):
    kw = dict(model=model_name, messages=MESSAGES, tools=TOOLS, tool_choice="required", max_tokens=80, temperature=0)
    if stream:
        content, calls, finish = _streamed(client.chat.completions.create(stream=True, **kw))
        assert content == ""
        _check_calls([(c["name"], c["arguments"]) for c in calls.values()])
    else:
        c = client.chat.completions.create(**kw).choices[0]
        assert c.message.content is None
        finish = c.finish_reason
        _check_calls([(t.function.name, t.function.arguments) for t in c.message.tool_calls])
    assert finish == "tool_calls"


def test_tool_results_go_back_through_the_template(client, model_name):
    """A conversation with an assistant tool call (content null) and the tool's answer renders and runs."""
    messages = MESSAGES + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 3}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    r = client.chat.completions.create(
        model=model_name, messages=messages, tools=TOOLS, tool_choice="none", max_tokens=3, temperature=0
    )
    assert r.choices[0].message.tool_calls in (None, []) and r.usage.completion_tokens == 3


def test_the_chat_template_receives_the_tools(default_tokenizer):
    """render_chat hands the tools to the template (the default model's template writes none: one that does)."""
    from attnserve.entrypoints.chat_utils import ChatTemplateOptions
    from attnserve.entrypoints.openai.protocol_chat import ChatCompletionRequest
    from attnserve.entrypoints.openai.serving_chat import render_chat

    template = default_tokenizer.chat_template
    default_tokenizer.chat_template = (
        "{% for t in tools or [] %}[{{ t.function.name }}]{% endfor %}"
        "{% for m in messages %}{{ m.content }}{% endfor %}"
    )
    try:
        req = ChatCompletionRequest.model_validate({"messages": MESSAGES, "tools": TOOLS, "tool_choice": "none"})
        ids = render_chat(SimpleNamespace(tokenizer=default_tokenizer), req, ChatTemplateOptions())
    finally:
        default_tokenizer.chat_template = template
    assert default_tokenizer.decode(ids) == "[get_weather][get_time]" + MESSAGES[0]["content"]


@pytest.fixture(scope="module")
def hermes():
    srv = RemoteServer(SERVER_ARGS + ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"])
    yield srv
    srv.stop()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_auto_with_the_hermes_parser(hermes, stream):
    client = hermes.openai()
    kw = dict(
        model=client.models.list().data[0].id,
        messages=MESSAGES,
        tools=TOOLS,
        max_tokens=80,
        temperature=0,
        extra_body={"structured_outputs": {"regex": HERMES_REGEX}},
    )
    if stream:
        chunks = list(client.chat.completions.create(stream=True, **kw))
        content, calls, finish = _streamed(chunks)
        calls = [(c["name"], c["arguments"]) for c in calls.values()]
        # the tokens the parser holds back send no chunk: each one says something (role, text, a call, the end)
        said = [
            (d.role, d.content, d.tool_calls, ch.finish_reason) for c in chunks for ch in c.choices for d in [ch.delta]
        ]
        assert all(any(x for x in s) for s in said), said
        assert len(said) < 10
    else:
        c = client.chat.completions.create(**kw).choices[0]
        content, finish = c.message.content, c.finish_reason
        calls = [(t.function.name, t.function.arguments) for t in c.message.tool_calls]
    assert content == "Sure. " and finish == "tool_calls" and [n for n, _ in calls] == ["get_weather"]
    _check_calls(calls)


def test_auto_without_a_call_is_content(hermes):
    client = hermes.openai()
    r = client.chat.completions.create(
        model=client.models.list().data[0].id, messages=MESSAGES, tools=TOOLS, max_tokens=5, temperature=0
    )
    c = r.choices[0]
    assert c.message.tool_calls in (None, []) and c.message.content and c.finish_reason == "length"


def test_required_with_parallel_tool_calls_false_makes_one_call(client, model_name):
    kw = dict(model=model_name, messages=MESSAGES, tools=TOOLS, tool_choice="required", max_tokens=80, temperature=0)
    c = client.chat.completions.create(parallel_tool_calls=False, **kw).choices[0]
    assert len(c.message.tool_calls) == 1 and c.finish_reason == "tool_calls"
    _check_calls([(t.function.name, t.function.arguments) for t in c.message.tool_calls])


def test_parallel_tool_calls_false_keeps_the_first_call_and_constrains_required():
    from attnserve.entrypoints.openai.protocol_chat import ChatCompletionRequest
    from attnserve.entrypoints.openai.tool_parsers import TOOL_PARSERS
    from attnserve.entrypoints.openai.tools import ToolMode, tool_constraint, tool_mode, tool_reply

    call = '<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{}", "days": 1}}}}\n</tool_call>\n'
    text = call.format("Paris") + call.format("Rome")
    for parallel, n in ((True, 2), (False, 1)):
        _, calls, finish = tool_reply(
            ToolMode("auto", parser=TOOL_PARSERS["hermes"](), parallel=parallel), text, "stop"
        )
        assert len(calls) == n and finish == "tool_calls"
        assert json.loads(calls[0].function.arguments) == {"city": "Paris", "days": 1}
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA_OF["get_weather"]}}]
    for parallel, most in ((None, None), (False, 1)):
        req = ChatCompletionRequest(
            messages=MESSAGES, tools=tools, tool_choice="required", parallel_tool_calls=parallel
        )
        _, constraint = tool_constraint(req, tool_mode(req, False, None))
        assert constraint.json.get("maxItems") == most


def test_a_streamed_named_call_sends_one_delta_per_chunk():
    from attnserve.entrypoints.openai.tools import ToolMode, ToolStream

    s = ToolStream(ToolMode("named", function="get_weather"))
    _, first, _ = s.feed('{"city"', None)
    assert len(first) == 1 and first[0].index == 0 and first[0].id
    assert (first[0].function.name, first[0].function.arguments) == ("get_weather", '{"city"')
    assert s.feed('{"city"', None)[1] is None  # nothing new
    _, last, finish = s.feed('{"city": "Paris"}', "stop")
    assert [(d.index, d.id, d.function.name, d.function.arguments) for d in last] == [(0, None, None, ': "Paris"}')]
    assert finish == "stop"
