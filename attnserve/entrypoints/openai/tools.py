"""Tool calling on ``/v1/chat/completions``: ``tools`` and ``tool_choice`` -> a constraint, the output -> tool calls.

- ``none``: plain text (the chat template still receives the tools, as in vLLM);
- ``auto`` (the default when tools are given): the model writes text or tool calls in its own format, read by the
  server's ``--tool-call-parser`` (``tool_parsers.py``); needs ``--enable-auto-tool-choice``;
- ``required``: the output is constrained to a JSON array of ``{"name", "parameters"}`` calls, one of the tools
  each, with that tool's parameter schema (vLLM's schema), finish reason ``tool_calls``;
- a named function: the output is constrained to that function's parameter schema and is its arguments.

Streams send content as it comes; tool calls go out as OpenAI's deltas: a named function's arguments as they are
generated, ``required`` and ``auto`` calls once each is complete (at the end of the output).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

from attnserve.core.structured_outputs import StructuredOutputsParams
from attnserve.entrypoints.openai.errors import refusal_error
from attnserve.entrypoints.openai.protocol_chat import (
    ChatCompletionRequest,
    DeltaFunctionCall,
    DeltaToolCall,
    FunctionCall,
    ToolCall,
)
from attnserve.entrypoints.openai.tool_parsers import TOOL_PARSERS, ParsedToolCall, ToolParser
from attnserve.refusals.serving import AUTO_TOOL_CHOICE, not_a_tool, tools_needed

NO_ARGUMENTS = {"type": "object", "properties": {}}


def tool_call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


@dataclass(frozen=True)
class ToolMode:
    """How one request's output becomes tool calls: ``kind`` none, auto, required or named (``function``)."""

    kind: str
    function: str | None = None
    parser: ToolParser | None = None
    parallel: bool = True  # False (``parallel_tool_calls: false``): at most one call


def tool_mode(req: ChatCompletionRequest, enable_auto_tool_choice: bool, tool_parser: str | None) -> ToolMode:
    """The request's tool mode; 400 (param ``tool_choice``) for a choice without tools, a named function not among
    them, or ``auto`` on a server started without ``--enable-auto-tool-choice --tool-call-parser``."""
    choice = req.tool_choice if req.tool_choice is not None else ("auto" if req.tools else "none")
    parallel = req.parallel_tool_calls is not False
    if choice == "none":
        return ToolMode("none")
    if not req.tools:
        value = choice if isinstance(choice, str) else choice.model_dump(mode="json", exclude_none=True)
        raise refusal_error(tools_needed(value))
    if choice == "auto":
        if not (enable_auto_tool_choice and tool_parser):
            raise refusal_error(AUTO_TOOL_CHOICE, param="tool_choice")
        return ToolMode("auto", parser=TOOL_PARSERS[tool_parser](), parallel=parallel)
    if choice == "required":
        return ToolMode("required", parallel=parallel)
    names = [t.function.name for t in req.tools]
    if choice.function.name not in names:
        raise refusal_error(not_a_tool(choice.function.name, names))
    return ToolMode("named", function=choice.function.name)


def tool_constraint(req: ChatCompletionRequest, mode: ToolMode) -> tuple[str, StructuredOutputsParams] | None:
    """The output constraint of ``required`` and a named function (the field to blame, the constraint)."""
    if mode.kind == "named":
        tool = next(t for t in req.tools if t.function.name == mode.function)
        return "tools", StructuredOutputsParams(json=tool.function.parameters or NO_ARGUMENTS)
    if mode.kind == "required":

        def one(t):
            return {
                "properties": {
                    "name": {"type": "string", "enum": [t.function.name]},
                    "parameters": t.function.parameters or NO_ARGUMENTS,
                },
                "required": ["name", "parameters"],
            }

        schema = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": [one(t) for t in req.tools]}}
        if not mode.parallel:
            schema["maxItems"] = 1
        return "tools", StructuredOutputsParams(json=schema)
    return None


def _required_calls(text: str) -> list[ParsedToolCall] | None:
    try:
        items = json.loads(text)
        return [ParsedToolCall(i["name"], json.dumps(i["parameters"], ensure_ascii=False)) for i in items]
    except (ValueError, TypeError, KeyError):
        return None


def tool_reply(mode: ToolMode, text: str, finish_reason: str | None) -> tuple[str | None, list[ToolCall], str | None]:
    """A whole output as (content, tool calls, finish reason): ``tool_calls`` when calls were made and the output
    ended by itself (a ``length`` stays: the calls may be cut short)."""
    if mode.kind == "none":
        return text, [], finish_reason
    if mode.kind == "named":
        return (
            None,
            [ToolCall(id=tool_call_id(), function=FunctionCall(name=mode.function, arguments=text))],
            finish_reason,
        )
    if mode.kind == "required":
        calls = _required_calls(text)
        content = None if calls is not None else text
    else:
        content, calls = mode.parser.extract(text)
    if not calls:
        return content if content is not None else text, [], finish_reason
    if not mode.parallel:  # the first call only (vLLM's maybe_filter_parallel_tool_calls)
        calls = calls[:1]
    out = [ToolCall(id=tool_call_id(), function=FunctionCall(name=c.name, arguments=c.arguments)) for c in calls]
    return content, out, "tool_calls" if finish_reason == "stop" else finish_reason


@dataclass
class ToolStream:
    """One choice's stream: what of the text so far goes out as content, what as tool-call deltas."""

    mode: ToolMode
    sent: int = 0  # characters of the text sent as content (or, named: as arguments)
    started: bool = False  # named: the first delta (id, name) went out
    held: bool = False  # auto: tool calls have started; the rest waits for the end
    calls: list = field(default_factory=list)

    def feed(self, text: str, finish_reason: str | None) -> tuple[str | None, list[DeltaToolCall] | None, str | None]:
        """(content delta, tool-call deltas, finish reason) for the text so far."""
        kind, done = self.mode.kind, finish_reason is not None
        if kind == "none":
            delta, self.sent = text[self.sent :], len(text)
            return delta, None, finish_reason
        if kind == "named":  # one call: its first delta carries the id, the name and the arguments so far
            args, self.sent = text[self.sent :], len(text)
            if not self.started:
                self.started = True
                call = DeltaToolCall(
                    index=0,
                    id=tool_call_id(),
                    type="function",
                    function=DeltaFunctionCall(name=self.mode.function, arguments=args),
                )
                return None, [call], finish_reason
            more = [DeltaToolCall(index=0, function=DeltaFunctionCall(arguments=args))] if args else None
            return None, more, finish_reason
        content = None
        if kind == "auto" and not self.held:
            safe, self.held = self.mode.parser.split(text)
            if done and not self.held:
                safe = len(text)
            if safe > self.sent:
                content, self.sent = text[self.sent : safe], safe
        if not done:
            return content, None, None
        _, calls, finish = tool_reply(self.mode, text, finish_reason)
        if not calls:  # nothing parsed: what was held back is content after all
            rest = text[self.sent :]
            self.sent = len(text)
            return ((content or "") + rest) or None, None, finish
        deltas = [
            DeltaToolCall(
                index=i,
                id=c.id,
                type="function",
                function=DeltaFunctionCall(name=c.function.name, arguments=c.function.arguments),
            )
            for i, c in enumerate(calls)
        ]
        return content, deltas, finish
