"""Structured outputs over HTTP: response_format, structured_outputs and the older guided_* fields; 400s for an
invalid schema, regex or grammar and for two constraints in one request."""

from __future__ import annotations

import json
import re

import openai
import pytest

from tests.structured_output.schemas import SCHEMAS

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("xgrammar")

CHAT = [{"role": "user", "content": "Describe a person as JSON."}]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_chat_response_format_json_schema(client, model_name, stream):
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMAS[0], "strict": True}}
    r = client.chat.completions.create(
        model=model_name, messages=CHAT, max_tokens=60, temperature=0, response_format=rf, stream=stream
    )
    if stream:
        chunks = list(r)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
    else:
        text, finish = r.choices[0].message.content, r.choices[0].finish_reason
    assert finish == "stop"
    jsonschema.validate(json.loads(text), SCHEMAS[0])


def test_chat_response_format_json_object(client, model_name):
    r = client.chat.completions.create(
        model=model_name, messages=CHAT, max_tokens=60, temperature=0, response_format={"type": "json_object"}
    )
    c = r.choices[0]
    assert c.message.content.lstrip().startswith("{")
    if c.finish_reason == "stop":
        assert isinstance(json.loads(c.message.content), dict)


@pytest.mark.parametrize(
    "field, value, check",
    [
        ("guided_regex", r"\d{3}-\d{2}", lambda t: re.fullmatch(r"\d{3}-\d{2}", t)),
        ("guided_choice", ["left", "right"], lambda t: t in ("left", "right")),
        ("guided_grammar", 'root ::= "x" [0-9] [0-9]', lambda t: re.fullmatch(r"x\d\d", t)),
        ("guided_json", SCHEMAS[1], lambda t: jsonschema.validate(json.loads(t), SCHEMAS[1]) is None),
        ("structured_outputs", {"choice": ["up", "down"]}, lambda t: t in ("up", "down")),
        ("structured_outputs", {"regex": "[a-c]{4}"}, lambda t: re.fullmatch("[a-c]{4}", t)),
    ],
    ids=["guided_regex", "guided_choice", "guided_grammar", "guided_json", "so_choice", "so_regex"],
)
def test_completion_vllm_fields(client, model_name, field, value, check):
    r = client.completions.create(
        model=model_name, prompt="Answer:", max_tokens=40, temperature=0, extra_body={field: value}
    )
    assert r.choices[0].finish_reason == "stop" and check(r.choices[0].text), r.choices[0].text


def test_max_tokens_inside_a_value_is_length(client, model_name):
    r = client.completions.create(
        model=model_name, prompt="JSON:", max_tokens=2, temperature=0, extra_body={"guided_json": SCHEMAS[0]}
    )
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 2


@pytest.mark.parametrize(
    "body, param, says",
    [
        (
            {"guided_json": {"type": "objectx"}},
            "guided_json",
            'guided_json: {"type": "objectx"} is not a valid JSON schema',
        ),
        ({"guided_regex": "(("}, "guided_regex", 'guided_regex: "((" is not a valid regular expression'),
        (
            {"guided_grammar": "root ::= foo"},
            "guided_grammar",
            'guided_grammar: "root ::= foo" is not a valid EBNF grammar',
        ),
        (
            {"structured_outputs": {"regex": "(("}},
            "structured_outputs.regex",
            'structured_outputs.regex: "((" is not a valid regular expression',
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 3}}}},
            "response_format",
            'response_format: {"type": 3} is not a valid JSON schema',
        ),
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs", "structured_outputs"),
        ({"structured_outputs": {"nope": 1}}, "structured_outputs.nope", "structured_outputs.nope: 1 not allowed"),
        ({"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice", "guided_choice together with guided_regex"),
        (
            {"guided_regex": "a", "guided_decoding_backend": "outlines"},
            "guided_decoding_backend",
            "guided_decoding_backend 'outlines' is not supported",
        ),
        (
            {"guided_regex": "a", "guided_whitespace_pattern": " "},
            "guided_whitespace_pattern",
            "guided_whitespace_pattern is not supported",
        ),
    ],
    ids=[
        "schema",
        "regex",
        "grammar",
        "so_regex",
        "response_format",
        "two_kinds",
        "unknown_key",
        "two_fields",
        "backend",
        "whitespace_pattern",
    ],
)
def test_invalid_constraints_are_400(server, client, model_name, body, param, says):
    r = server.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 2, **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["message"].startswith(says), error
    # the engine goes on
    ok = client.completions.create(
        model=model_name, prompt="Hi", max_tokens=3, temperature=0, extra_body={"guided_choice": ["a", "b"]}
    )
    assert ok.choices[0].text in ("a", "b")


def test_streamed_invalid_constraint_is_400_before_the_stream(client, model_name):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(
            model=model_name, prompt="x", max_tokens=2, stream=True, extra_body={"guided_regex": "(("}
        )
    assert e.value.body["param"] == "guided_regex"
