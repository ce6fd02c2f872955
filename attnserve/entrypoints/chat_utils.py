"""Chat messages as the chat template sees them; shared by ``LLM.chat`` and ``/v1/chat/completions``.

The checks and their words are the server's (its request schema, ``openai/protocol.py``, says the same words;
``tests/entrypoints/test_chat_utils.py`` holds both to it): a bad message raises RequestValueError, whose
place Python writes ``messages[0].content`` and the server ``messages.0.content``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from attnserve.engine.request_checks import RequestValueError
from attnserve.refusals.words import (CHAT_ROLES, CONTENT_WORDS, MESSAGE_WORDS, MESSAGES_WORDS,  # noqa: F401 (re-exported)
                                      ROLE_WORDS, TEXT_PART, TEXT_PART_WORDS)


def is_list(value) -> bool:
    """A list (any sequence) of items, not text or a mapping: what a conversation and a list of parts are."""
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes, Mapping))


def chat_messages(messages: Sequence[Mapping], path: tuple[str | int, ...] = ("messages",)) -> list[dict]:
    """Validate OpenAI chat messages; returns ``{"role", "content": str[, "name"][, "tool_calls"][,
    "tool_call_id"]}`` per message (tool calls' JSON ``arguments`` decoded into objects, as chat templates read them).

    Content is required whatever the role, except for an assistant message that carries ``tool_calls`` (OpenAI's
    rule; its content may then be null or absent, and is rendered as ""); a list of text parts
    ``{"type": "text", "text": str}`` holds one at least (OpenAI refuses ``[]``) and its texts are joined; an empty
    name is dropped; other keys are ignored. Raises RequestValueError (a ValueError) naming the field by its place
    under ``path`` (``messages[0].content``), the value and what is allowed, in the server's words:
    ``messages[0].content [] not allowed (allowed: a string, or a non-empty list of text parts {"type": "text",
    "text": string})``."""
    if not is_list(messages):
        raise RequestValueError(path, messages, MESSAGES_WORDS, noun="a list")
    if not messages:
        raise RequestValueError(path, messages, MESSAGES_WORDS)
    return [_chat_message((*path, i), m) for i, m in enumerate(messages)]


def _chat_message(path: tuple[str | int, ...], m: Mapping) -> dict:
    if not isinstance(m, Mapping):
        raise RequestValueError(path, m, MESSAGE_WORDS, noun="a chat message")
    tool_calls = m.get("tool_calls") or None
    for key, required in (("role", ROLE_WORDS), ("content", CONTENT_WORDS)):
        if key not in m and not (key == "content" and tool_calls):  # content: was read as "" (not what was meant)
            raise RequestValueError((*path, key), RequestValueError.MISSING, required)
    role, content, name = m["role"], m.get("content"), m.get("name")
    if role not in CHAT_ROLES:
        raise RequestValueError((*path, "role"), role, ROLE_WORDS)
    extra = {}
    if tool_calls is not None:
        if role != "assistant":
            raise RequestValueError((*path, "tool_calls"), tool_calls, "only on an assistant message")
        extra["tool_calls"] = [_tool_call((*path, "tool_calls", j), c) for j, c in enumerate(tool_calls)]
    if m.get("tool_call_id") is not None:
        extra["tool_call_id"] = m["tool_call_id"]
    if content is None and tool_calls is not None:
        # "" as vLLM renders it: templates that read content (most do) would fail on a missing one
        return {"role": role, "content": "", **({"name": name} if name else {}), **extra}
    if not isinstance(content, str):
        if not is_list(content) or not content:
            raise RequestValueError((*path, "content"), content, CONTENT_WORDS)
        content = "".join(_text_part((*path, "content", j), p) for j, p in enumerate(content))
    if name is not None and not isinstance(name, str):
        raise RequestValueError((*path, "name"), name, "string, or None", noun="a string")
    return {"role": role, "content": content, **({"name": name} if name else {}), **extra}


def _tool_call(path: tuple[str | int, ...], call) -> dict:
    """An assistant message's tool call, its ``function.arguments`` JSON text decoded (templates read objects)."""
    fn = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
        raise RequestValueError(path, call, '{"id": string, "type": "function", "function": {"name": string, '
                                '"arguments": JSON text}}')
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            raise RequestValueError((*path, "function", "arguments"), args, "JSON text") from None
    return {**call, "function": {**fn, "arguments": args}}


def _text_part(path: tuple[str | int, ...], part) -> str:
    """The text of one content part ``{"type": "text", "text": str}``."""
    if not isinstance(part, Mapping):
        raise RequestValueError(path, part, TEXT_PART_WORDS, noun=TEXT_PART)
    if "type" not in part:
        raise RequestValueError((*path, "type"), RequestValueError.MISSING, '"text"')
    if part["type"] != "text":
        raise RequestValueError((*path, "type"), part["type"], '"text"')
    if "text" not in part:
        raise RequestValueError((*path, "text"), RequestValueError.MISSING, "a string")
    if not isinstance(part["text"], str):
        raise RequestValueError((*path, "text"), part["text"], "string", noun="a string")
    return part["text"]
