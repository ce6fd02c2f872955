"""Chat messages as the chat template sees them; shared by ``LLM.chat`` and ``/v1/chat/completions``.

The checks and their words are the server's (its request schema, ``openai/protocol.py``, says the same words;
``tests/entrypoints/test_chat_utils.py`` holds both to it): a bad message raises RequestValueError, whose
place Python writes ``messages[0].content`` and the server ``messages.0.content``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from attnserve.engine.request_checks import RequestValueError
from attnserve.refusals import Refusal, Refused
from attnserve.refusals.requests import (
    A_CHAT_MESSAGE,
    A_LIST,
    A_MAPPING,
    A_STRING,
    CHAT_ROLES,
    CONTENT_WORDS,
    CONTINUE_FINAL_MESSAGE,
    JSON_TEXT,
    MESSAGE_WORDS,
    MESSAGES_WORDS,
    NAME_WORDS,
    NO_CHAT_TEMPLATE,
    ONLY_ON_ASSISTANT,
    ROLE_WORDS,
    STRING,
    TEMPLATE_KWARGS_WORDS,
    TEXT_PART,
    TEXT_PART_WORDS,
    TEXT_TYPE,
    TOOL_CALL_WORDS,
    reserved_template_kwarg,
    template_failed,
    unreadable_template,
)  # noqa: F401 (re-exported)


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
        raise RequestValueError(path, messages, MESSAGES_WORDS, noun=A_LIST)
    if not messages:
        raise RequestValueError(path, messages, MESSAGES_WORDS)
    return [_chat_message((*path, i), m) for i, m in enumerate(messages)]


def _chat_message(path: tuple[str | int, ...], m: Mapping) -> dict:
    if not isinstance(m, Mapping):
        raise RequestValueError(path, m, MESSAGE_WORDS, noun=A_CHAT_MESSAGE)
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
            raise RequestValueError((*path, "tool_calls"), tool_calls, ONLY_ON_ASSISTANT)
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
        raise RequestValueError((*path, "name"), name, NAME_WORDS, noun=A_STRING)
    return {"role": role, "content": content, **({"name": name} if name else {}), **extra}


def _tool_call(path: tuple[str | int, ...], call) -> dict:
    """An assistant message's tool call, its ``function.arguments`` JSON text decoded (templates read objects)."""
    fn = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
        raise RequestValueError(path, call, TOOL_CALL_WORDS)
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            raise RequestValueError((*path, "function", "arguments"), args, JSON_TEXT) from None
    return {**call, "function": {**fn, "arguments": args}}


def _text_part(path: tuple[str | int, ...], part) -> str:
    """The text of one content part ``{"type": "text", "text": str}``."""
    if not isinstance(part, Mapping):
        raise RequestValueError(path, part, TEXT_PART_WORDS, noun=TEXT_PART)
    if "type" not in part:
        raise RequestValueError((*path, "type"), RequestValueError.MISSING, TEXT_TYPE)
    if part["type"] != "text":
        raise RequestValueError((*path, "type"), part["type"], TEXT_TYPE)
    if "text" not in part:
        raise RequestValueError((*path, "text"), RequestValueError.MISSING, A_STRING)
    if not isinstance(part["text"], str):
        raise RequestValueError((*path, "text"), part["text"], STRING, noun=A_STRING)
    return part["text"]


# --- chat templates ----------------------------------------------------------------------------------------------
# the template's text: an argument holding none of these is a file name (vLLM's rule in load_chat_template)
_JINJA_CHARS = "{}\n"
# chat_template_kwargs that are no template variables: the template is chosen by chat_template, the text is rendered
# untokenized (vLLM refuses both too)
RESERVED_TEMPLATE_KWARGS = ("chat_template", "tokenize")


def load_chat_template(chat_template: str | None, path: tuple[str | int, ...] = ("chat_template",)) -> str | None:
    """``--chat-template`` as vLLM reads it: the contents of the file it names, else the argument itself as the
    template when it holds ``{``, ``}`` or a newline; None stays None. Raises Refused for a file that cannot be read
    when the argument is no template (``chat_template 'tmpl.jinja' cannot be read ([Errno 2] No such file ...)``)."""
    if chat_template is None:
        return None
    try:
        with open(os.path.expanduser(chat_template), encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        if not any(c in chat_template for c in _JINJA_CHARS):
            raise Refused(unreadable_template(path, chat_template, e)) from None
        return chat_template


@dataclass(frozen=True)
class ChatTemplateOptions:
    """How a conversation becomes prompt text (vLLM's ChatParams): which template (None: the tokenizer's), the
    generation prompt or the final message left open, and more variables for the template."""

    chat_template: str | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: Mapping[str, Any] | None = None


def check_chat_template_options(options: ChatTemplateOptions) -> None:
    """Raise Refused for what no template can do: both ``add_generation_prompt`` and ``continue_final_message`` (a
    new assistant turn and the last message left open; vLLM refuses both true), a ``chat_template_kwargs`` that is
    no mapping or names ``chat_template`` or ``tokenize`` (no template variables). ``add_generation_prompt`` and
    ``continue_final_message`` inside ``chat_template_kwargs`` win over the fields, as in vLLM."""
    kwargs = options.chat_template_kwargs
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise Refused(Refusal(("chat_template_kwargs",), kwargs, TEMPLATE_KWARGS_WORDS, noun=A_MAPPING))
    for name in RESERVED_TEMPLATE_KWARGS:
        if kwargs is not None and name in kwargs:
            raise Refused(reserved_template_kwarg(name, kwargs[name]))
    generation_prompt, continue_final = _template_flags(options)
    if generation_prompt and continue_final:
        raise Refused(CONTINUE_FINAL_MESSAGE)


def _template_flags(options: ChatTemplateOptions) -> tuple[object, object]:
    """(add_generation_prompt, continue_final_message) as the template sees them: ``chat_template_kwargs``' over the
    fields (vLLM merges the kwargs last)."""
    kwargs = options.chat_template_kwargs or {}
    return (
        kwargs.get("add_generation_prompt", options.add_generation_prompt),
        kwargs.get("continue_final_message", options.continue_final_message),
    )


def apply_chat_template(
    tokenizer, conversation: list[dict], options: ChatTemplateOptions, tools: list[dict] | None = None
) -> str:
    """The prompt text of ``conversation`` (messages as :func:`chat_messages` returns them) under ``options``,
    through transformers' ``apply_chat_template``; the template sees ``chat_template_kwargs`` as variables (Qwen3's
    ``enable_thinking``; its ``add_generation_prompt`` and ``continue_final_message`` over the fields, as in vLLM);
    ``tools``: the request's function definitions, which the template renders (None: none). Raises Refused: the
    options' own mistakes (:func:`check_chat_template_options`), no template at all (the tokenizer has none and none
    is given), and what the template raised (a Jinja syntax error, its own ``raise_exception``, a final message that
    ``continue_final_message`` cannot find in the text), named by ``chat_template`` when the template was given,
    else ``messages``."""
    check_chat_template_options(options)
    template = options.chat_template
    if template is None and getattr(tokenizer, "chat_template", None) is None:
        raise Refused(NO_CHAT_TEMPLATE)
    generation_prompt, continue_final = _template_flags(options)
    kwargs = {
        **(options.chat_template_kwargs or {}),
        "add_generation_prompt": generation_prompt,
        "continue_final_message": continue_final,
    }
    try:
        text = tokenizer.apply_chat_template(
            conversation, chat_template=template, tokenize=False, tools=tools, **kwargs
        )
        if not isinstance(text, str):  # a kwarg of apply_chat_template's own (return_dict, ...) changed its answer
            raise TypeError(f"apply_chat_template returned {type(text).__name__}, not the prompt text")
        return text
    except Exception as e:  # noqa: BLE001 - templates raise what they like (jinja's TemplateError, ValueError, ...)
        raise Refused(template_failed(template is not None, e)) from None
