"""Reading a request body as JSON, with a 400 that says what is wrong where Python's parser has none of its own.

FastAPI parses a JSON body with ``json.loads`` and answers anything but a ``JSONDecodeError`` with "There was
an error parsing the body": bytes that are not UTF-8, an integer longer than Python reads (4300 digits), and
arrays nested deeper than its recursion limit (or a RecursionError further on); and a lone surrogate escape
(``"\\ud800"``) reads fine but fails the tokenizer later (a 500). ``parse_body`` refuses those with their own
message, and refuses nesting past ``MAX_DEPTH`` before parsing, so that no later step recurses
that deep. JSON in UTF-16 or UTF-32 (announced by its first bytes, as Python's parser reads it) is read; a body
those bytes announce that is no JSON in that encoding (a UTF-16 BOM before UTF-8 JSON) is judged as UTF-8, the
encoding the API takes. A number beyond a 64-bit float (``1e400``, which Python reads as infinity) keeps the text it
was sent as (``SentNumber``), for the 400 to echo it. ``JSONBodyRoute`` makes the API's routes read bodies this way.
"""

from __future__ import annotations

import codecs
import json
import math
import re
import sys
from typing import Any, Callable

from fastapi import Request, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException

from attnserve.refusals import Refusal, openai_error
from attnserve.refusals.serving import body_integer_too_long, body_not_utf8, body_too_deep
from attnserve.refusals.serving import lone_surrogate as lone_surrogate_refusal

# arrays and objects in arrays and objects: an OpenAI request needs a handful (messages, content parts)
MAX_DEPTH = 100
# a JSON string (skipped whole, brackets in it are text) or one bracket
_STRING_OR_BRACKET = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')
# a \uD800-\uDFFF escape, any case: in text that decoded (UTF-8 and UTF-16/32 decoding refuse a surrogate), the
# only way a parsed string can hold one; text without such an escape is not walked (large prompts stay cheap)
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


class SentNumber(float):
    """A JSON number that is no finite 64-bit float, with its ``text`` as sent: ``1e400`` (read as infinity), and
    Python's extensions ``NaN``, ``Infinity``, ``-Infinity``. Request fields refuse it (no infinity, no NaN)."""

    text: str

    def __new__(cls, text: str) -> SentNumber:
        number = super().__new__(cls, text)
        number.text = text
        return number


def _float(text: str) -> float:
    number = float(text)
    return number if math.isfinite(number) else SentNumber(text)


def too_deep(text: str) -> int | None:
    """How deep arrays and objects nest in the JSON ``text`` (``[[1]]``: 2) when that is deeper than MAX_DEPTH,
    else None. Brackets inside strings are text; a body with fewer brackets than that is not scanned."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return None
    level = deepest = 0
    for match in _STRING_OR_BRACKET.finditer(text):
        char = match.group()
        if char in "[{":
            level += 1
            deepest = max(deepest, level)
        elif char in "]}":
            level -= 1
    return deepest if deepest > MAX_DEPTH else None


def lone_surrogate(value: Any, path: str = "") -> tuple[str, str, int] | None:
    """(dotted path, the string, index) of the first string in the parsed JSON ``value`` that holds a lone UTF-16
    surrogate (a ``\\ud800`` escape without its pair: no Unicode character, and no tokenizer takes it); None
    when there is none. Object keys are not searched."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            return path, value, e.start
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = lone_surrogate(item, f"{path}.{key}" if path else str(key))
        if found is not None:
            return found
    return None


def parse_body(body: bytes) -> Any:
    """The request body ``body`` as JSON. Raises json.JSONDecodeError for malformed JSON (FastAPI's 400 with its
    position), and an HTTPException 400 with its own message for bytes that are not UTF-8 text, nesting deeper than
    ``MAX_DEPTH``, an integer longer than Python reads, or a lone surrogate escape.

    JSON in UTF-16 or UTF-32, which Python's parser reads by the body's first bytes (a BOM, or NUL bytes), is read
    too; a body that those bytes announce but that is no JSON in that encoding is judged as the UTF-8 that the API
    takes: bytes FF FE (UTF-16's BOM) and then UTF-8 JSON is ``not valid UTF-8 (byte 0xff at offset 0: ...)``, as
    any other body that is not UTF-8, not "malformed JSON" about the characters a UTF-16 reading made of it."""
    encoding = json.detect_encoding(body)
    if not encoding.startswith("utf-8"):
        try:
            return _parse_text(body.decode(encoding))
        except (UnicodeDecodeError, json.JSONDecodeError):
            pass  # not JSON in the encoding its first bytes suggest: read as UTF-8, the encoding asked for
    bom = len(codecs.BOM_UTF8) if body.startswith(codecs.BOM_UTF8) else 0  # skipped, as Python's parser skips it
    try:
        text = body[bom:].decode("utf-8")
    except UnicodeDecodeError as e:
        at = bom + e.start  # in the body as sent
        raise _refused(body_not_utf8(body[at], at, e.reason)) from None
    return _parse_text(text)


def _parse_text(text: str) -> Any:
    """The decoded body ``text`` as JSON; the HTTPExceptions of :func:`parse_body` but for the encoding."""
    if (levels := too_deep(text)) is not None:
        raise _refused(body_too_deep(levels, MAX_DEPTH))
    try:
        parsed = json.loads(text, parse_float=_float, parse_constant=SentNumber)
    except json.JSONDecodeError:
        raise
    except ValueError:  # int() past sys.get_int_max_str_digits()
        raise _refused(body_integer_too_long(sys.get_int_max_str_digits())) from None
    if _SURROGATE_ESCAPE.search(text) and (found := lone_surrogate(parsed)) is not None:
        path, string, index = found
        where = tuple(int(p) if p.isdigit() else p for p in path.split(".")) if path else ("body",)
        raise _refused(lone_surrogate_refusal(where, string, index))
    return parsed


def _refused(refusal: Refusal) -> HTTPException:
    """The 400 for a body refused before validation, in the server's words; its ``param`` (the refused string's
    place, or None for the body as a whole) rides on the exception to the server's handler."""
    message, param = openai_error(refusal)
    e = HTTPException(400, message)
    e.param = param if refusal.path != ("body",) else None
    return e


class JSONBodyRequest(Request):
    """A request whose ``json()`` is :func:`parse_body`'s."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = parse_body(await self.body())
        return self._json


class JSONBodyRoute(APIRoute):
    """An API route that reads its JSON body with :func:`parse_body` (FastAPI's documented custom-Request route)."""

    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            return await handler(JSONBodyRequest(request.scope, request.receive))

        return handle
