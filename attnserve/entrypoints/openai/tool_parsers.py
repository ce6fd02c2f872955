"""Tool-call parsers for ``tool_choice: "auto"`` (``--tool-call-parser``): a model's text -> content and tool calls.

Each parser knows the format its model family was trained to write (vLLM's parsers of the same names):

- ``hermes`` (Hermes, Qwen2.5/3): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one block per call;
- ``llama3_json`` (Llama 3.x): the whole output is ``{"name": ..., "parameters": {...}}`` (optionally after
  ``<|python_tag|>``), several separated by ``;``;
- ``mistral``: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]``.

Text that does not parse is content, as in vLLM: the client gets what the model wrote.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class ParsedToolCall:
    name: str
    arguments: str  # JSON text


def _call(obj, args_keys: tuple[str, ...]) -> ParsedToolCall:
    """A parsed call from ``{"name": ..., <args key>: {...}}``; ValueError for another shape."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise ValueError("not a tool call")
    args = next((obj[k] for k in args_keys if k in obj), {})
    return ParsedToolCall(obj["name"], args if isinstance(args, str) else json.dumps(args, ensure_ascii=False))


class ToolParser:
    """``extract`` parses a whole output; ``split`` tells a stream how much of the text so far is content."""

    name = ""
    marker = ""  # the text that starts the tool calls

    def extract(self, text: str) -> tuple[str | None, list[ParsedToolCall]]:
        """(content or None, tool calls) of a whole output; no calls when it does not parse."""
        raise NotImplementedError

    def split(self, text: str) -> tuple[int, bool]:
        """For a stream: (how many leading characters are content for sure, whether tool calls have started).
        Held back: a tail that may begin the marker."""
        i = text.find(self.marker)
        if i != -1:
            return i, True
        for k in range(min(len(self.marker) - 1, len(text)), 0, -1):  # the longest tail that begins the marker
            if self.marker.startswith(text[-k:]):
                return len(text) - k, False
        return len(text), False


class HermesToolParser(ToolParser):
    name = "hermes"
    marker = "<tool_call>"
    _blocks = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)

    def extract(self, text: str) -> tuple[str | None, list[ParsedToolCall]]:
        start = text.find(self.marker)
        if start == -1:
            return text, []
        try:
            calls = [_call(json.loads(a or b), ("arguments",)) for a, b in self._blocks.findall(text)]
        except ValueError:
            return text, []
        return text[:start] or None, calls


class Llama3JsonToolParser(ToolParser):
    name = "llama3_json"
    marker = "<|python_tag|>"

    def extract(self, text: str) -> tuple[str | None, list[ParsedToolCall]]:
        body = text.strip()
        body = body.removeprefix(self.marker).lstrip()
        if not body.startswith("{"):
            return text, []
        decoder, calls, i = json.JSONDecoder(), [], 0
        try:
            while i < len(body):
                obj, i = decoder.raw_decode(body, i)
                calls.append(_call(obj, ("parameters", "arguments")))
                while i < len(body) and body[i] in " \t\r\n;":
                    i += 1
        except ValueError:
            return text, []
        return None, calls

    def split(self, text: str) -> tuple[int, bool]:
        body = text.lstrip()
        if not body:
            return 0, False
        if body.startswith("{") or body.startswith(self.marker):
            return 0, True
        if self.marker.startswith(body):
            return 0, False
        return len(text), False  # the output does not start with a call: all of it is content


class MistralToolParser(ToolParser):
    name = "mistral"
    marker = "[TOOL_CALLS]"
    skips_no_special_tokens = True  # [TOOL_CALLS] is a special token: the text must keep it

    def extract(self, text: str) -> tuple[str | None, list[ParsedToolCall]]:
        start = text.find(self.marker)
        if start == -1:
            return text, []
        try:
            obj = json.loads(text[start + len(self.marker) :])
            calls = [_call(o, ("arguments", "parameters")) for o in (obj if isinstance(obj, list) else [obj])]
        except ValueError:
            return text, []
        return text[:start] or None, calls


TOOL_PARSERS: dict[str, type[ToolParser]] = {
    p.name: p for p in (HermesToolParser, Llama3JsonToolParser, MistralToolParser)
}
