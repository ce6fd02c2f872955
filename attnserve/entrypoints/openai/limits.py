"""Limits on a request's lists: how many stop strings, how long each, how many stop token ids, how many prompts.

Each is refused with a 400 in OpenAI's error format before any tokenizing, ``param`` the field (or the item),
``code`` OpenAI's for the kind of limit (``array_above_max_length``, ``string_above_max_length``), the message
naming the limit: ``stop: has 65 items (allowed: at most 64 stop strings)``. The body as a whole is limited by
``--max-request-body-bytes`` (``body_limit.py``).
"""

from __future__ import annotations

from attnserve.entrypoints.openai.errors import OpenAIError
from attnserve.refusals import Refusal, openai_error
from attnserve.refusals import serving as words

MAX_STOP_STRINGS = 64
MAX_STOP_STRING_CHARS = 1024  # a stream holds back up to this many characters minus one (a stop string's start)
MAX_STOP_TOKEN_IDS = 1024
MAX_PROMPTS = 1024  # prompts of one completions request (each with n completions: n <= 128)


def check_request_lists(req) -> None:
    """400 for the first list of ``req`` (a completions or chat completions request) over its limit."""
    stop = req.stop
    if isinstance(stop, list):
        _check_count(("stop",), stop, MAX_STOP_STRINGS, "stop strings")
    for i, s in enumerate([stop] if isinstance(stop, str) else stop or []):
        if len(s) > MAX_STOP_STRING_CHARS:
            path = ("stop",) if isinstance(stop, str) else ("stop", i)
            _refuse(words.string_too_long(path, len(s), MAX_STOP_STRING_CHARS), "string_above_max_length")
    if req.stop_token_ids:
        _check_count(("stop_token_ids",), req.stop_token_ids, MAX_STOP_TOKEN_IDS, "stop token ids")
    prompt = getattr(req, "prompt", None)
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):  # a batch: strings or id lists
        _check_count(("prompt",), prompt, MAX_PROMPTS, "prompts")


def _check_count(path: tuple[str, ...], items: list, limit: int, what: str) -> None:
    if len(items) > limit:
        _refuse(words.too_many(path, len(items), limit, what), "array_above_max_length")


def _refuse(refusal: Refusal, code: str) -> None:
    message, param = openai_error(refusal)
    raise OpenAIError(message, 400, param=param, code=code)
