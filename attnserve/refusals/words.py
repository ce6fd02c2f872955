"""The vocabulary refusals are worded in: what a config field, a chat message or a prompt allows, in words.

Each is the ``allowed`` (or ``noun``) of a :class:`~attnserve.refusals.Refusal`; the modules that check the values
import them from here, so that one place holds every phrase a refusal says.
"""

from __future__ import annotations

import json

from attnserve.refusals import Refusal, range_words

# ---------------------------------------------------------------- config fields (config/fields.py)

TYPE_WORDS = {bool: "true, false", int: "integer", float: "number", str: "string"}
"""A config field's type as its allowed values: ``integer``, ``true, false``."""
TYPE_NOUNS = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
"""What a value of another type is not: ``'32' is a string, not an integer``."""
HUMAN_INT_WORDS = (
    "suffixes as in vLLM: k, m, g, t = 10^3, 10^6, 10^9, 10^12 (with a fraction: 1.5k); "
    "K, M, G, T = 2^10, 2^20, 2^30, 2^40 (whole numbers only)"
)
"""What :func:`attnserve.config.fields.parse_human_int` takes beyond a plain integer."""


def field_words(base: type, optional: bool, meta: dict) -> str:
    """A config field's allowed values from its type and metadata (``words``, ``choices``, ``gt``/``ge``/``le``,
    ``unit``): ``integer >= 1``, ``2, 3, 4, null``, ``integer >= 1 (bytes), null``."""
    if "words" in meta:
        words = meta["words"]
    elif "choices" in meta:
        words = ", ".join(str(c) for c in meta["choices"])
    else:
        low = next(((op, meta[k]) for k, op in (("gt", ">"), ("ge", ">=")) if k in meta), None)
        words = range_words(
            TYPE_WORDS.get(base, getattr(base, "__name__", str(base))),
            low,
            ("<=", meta["le"]) if "le" in meta else None,
        )
        if "unit" in meta:
            words += f" ({meta['unit']})"
    return words + (", null" if optional else "")


# ---------------------------------------------------------------- requests (engine/request_checks.py, chat_utils.py)

EMPTY_PROMPT = "a prompt of at least 1 token"


def token_id_words(vocab_size: int) -> str:
    """The allowed token ids in words: ``integer in [0, 49152), the vocabulary size``."""
    return f"{range_words('integer', ('>=', 0), ('<', vocab_size))}, the vocabulary size"


CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")  # protocol.ChatMessage.role's Literal
MESSAGES_WORDS = "a non-empty list of chat messages"
MESSAGE_WORDS = 'an object with "role" and "content", optionally "name", "tool_calls" and "tool_call_id"'
ROLE_WORDS = ", ".join(json.dumps(r) for r in CHAT_ROLES)
CONTENT_WORDS = 'a string, or a non-empty list of text parts {"type": "text", "text": string}'
TEXT_PART = 'a text part {"type": "text", "text": string}'
TEXT_PART_WORDS = 'an object with "type" and "text"'


# ---------------------------------------------------------------- command lines (entrypoints/cli/)

LOGIT_BIAS = "TOKEN_ID=BIAS"
"""What one ``--logit-bias`` flag takes."""


def no_prompts(path: str, flag: str, instead: str) -> Refusal:
    """A prompts file ``path`` given by ``flag`` with no prompt in it; without the flag the command takes
    ``instead`` (``the default prompt``, ``random prompts``)."""
    return Refusal(
        subject=path,
        reason="has no prompts",
        advice=f"give one prompt per line, or leave {flag} out for {instead}",
        origin=f"argument {flag}",
    )
