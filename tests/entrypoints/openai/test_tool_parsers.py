"""The auto tool-choice parsers on text (no model): whole outputs and what a stream may send as content."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from attnserve.entrypoints.openai.tool_parsers import TOOL_PARSERS, ParsedToolCall
from attnserve.entrypoints.openai.tools import ToolMode, ToolStream
from tests.helpers import ROOT

CALL = ParsedToolCall("get_weather", '{"city": "Paris"}')


@pytest.mark.parametrize(
    "parser, text, content, calls",
    [
        (
            "hermes",
            'Sure. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
            "Sure. ",
            [CALL],
        ),
        (
            "hermes",
            '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>\n<tool_call>'
            '{"name": "get_time", "arguments": {}}</tool_call>',
            None,
            [CALL, ParsedToolCall("get_time", "{}")],
        ),
        ("hermes", "no call here", "no call here", []),
        ("hermes", "<tool_call>{broken", "<tool_call>{broken", []),
        ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Paris"}}', None, [CALL]),
        (
            "llama3_json",
            '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
            '{"name": "get_time", "parameters": {}}',
            None,
            [CALL, ParsedToolCall("get_time", "{}")],
        ),
        ("llama3_json", "The weather is fine.", "The weather is fine.", []),
        ("mistral", 'Ok [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]', "Ok ", [CALL]),
        ("mistral", "[TOOL_CALLS]not json", "[TOOL_CALLS]not json", []),
    ],
)
def test_extract(parser, text, content, calls):
    assert TOOL_PARSERS[parser]().extract(text) == (content, calls)


def test_a_stream_holds_back_what_may_begin_a_call():
    stream = ToolStream(ToolMode("auto", parser=TOOL_PARSERS["hermes"]()))
    assert stream.feed("Sure. <tool", None) == ("Sure. ", None, None)  # "<tool" may begin "<tool_call>"
    assert stream.feed('Sure. <tool_call>\n{"name"', None) == (None, None, None)
    text = 'Sure. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    content, deltas, finish = stream.feed(text, "stop")
    assert content is None and finish == "tool_calls"
    assert [(d.index, d.function.name, json.loads(d.function.arguments)) for d in deltas] == [
        (0, "get_weather", {"city": "Paris"})
    ]


def test_a_stream_without_a_call_sends_what_it_held_back():
    stream = ToolStream(ToolMode("auto", parser=TOOL_PARSERS["hermes"]()))
    assert stream.feed("a <tool", None) == ("a ", None, None)
    assert stream.feed("a <tool", "length") == ("<tool", None, "length")


@pytest.mark.parametrize(
    "args, says",
    [
        (["--enable-auto-tool-choice"], "argument --enable-auto-tool-choice: needs --tool-call-parser"),
        (["--tool-call-parser", "hermes"], "argument --tool-call-parser: needs --enable-auto-tool-choice"),
        (
            ["--enable-auto-tool-choice", "--tool-call-parser", "nope"],
            "argument --tool-call-parser: 'nope' not allowed (allowed: ",
        ),
    ],
)
def test_serve_tool_flags_refused_alone(args, says):
    r = subprocess.run(
        [sys.executable, "-m", "attnserve", "serve", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 2 and says in r.stderr, r.stderr
