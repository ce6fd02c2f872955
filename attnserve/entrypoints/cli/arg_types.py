"""Checked argparse types: a bad flag value exits 2 with one line naming the value and what is allowed.

``checked(int, lambda v: v >= 1, "integer >= 1")`` parses ``"0"`` into argparse's error
``argument --num-prompts: 0 not allowed (allowed: integer >= 1)`` and ``"x"`` into ``argument --num-prompts:
'x' is not an integer (allowed: integer >= 1)``; ``typed(int)`` checks the type only (``'x' is not an
integer``), for a flag whose range is checked where its value is used. Every int or float flag of the
``attnserve`` command is one of these (tests/entrypoints/test_flag_types.py), never a bare ``type=int``,
whose error (``invalid int value: 'x'``) does not say what is allowed.
"""

from __future__ import annotations

import argparse
import math
from typing import Callable

from attnserve.refusals import TEXT, Refusal, range_words, statement
from attnserve.refusals.cli import output_file_problem, output_file_words

_NOUNS = {int: ("integer", "an integer"), float: ("number", "a number")}


def not_a(convert: type[int] | type[float], text: str, allowed: str) -> str:
    """``'x' is not an integer (allowed: ALLOWED)``; no parenthesis when ``allowed`` is the bare type word."""
    word, noun = _NOUNS.get(convert, _NOUNS[int])
    return statement(Refusal(value=text, allowed=None if allowed == word else allowed, noun=noun))


def checked(convert: type[int] | type[float], ok: Callable[[float], bool], allowed: str) -> Callable[[str], float]:
    """An argparse type: ``convert(text)`` (int or float), accepted when ``ok(value)``; ArgumentTypeError naming
    the text and ``allowed`` else."""

    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(not_a(convert, text, allowed)) from None
        if not ok(value):
            raise argparse.ArgumentTypeError(statement(Refusal(value=value, allowed=allowed, written=TEXT)))
        return value

    parse.__name__ = _NOUNS.get(convert, _NOUNS[int])[
        0
    ]  # argparse's fallback wording, should an error escape the above
    return parse


def typed(convert: type[int] | type[float], allowed: str | None = None) -> Callable[[str], float]:
    """An argparse type that checks the type only: any int (float) is accepted, text that is none is refused
    naming ``allowed`` (default: the bare type word) — for flags whose range is checked where the value is used."""
    return checked(convert, lambda _: True, allowed or _NOUNS[convert][0])


def one_of(choices: list[str] | tuple[str, ...], path: tuple[str, ...] = (), allowed: str | None = None) -> dict:
    """The ``add_argument`` keywords of a flag that takes one of ``choices``: refused in the project's line
    (``argument --dtype: 'fp9' not allowed (allowed: auto, float32, ...)``, as a config file's value is), not
    argparse's ``invalid choice``, when the command line is parsed; ``--help`` lists them as argparse does
    (``{auto,float32,...}``). ``path``, ``allowed``: an engine argument's (its setting, its words)."""
    allowed = allowed or ", ".join(choices)

    def parse(text: str) -> str:
        if text not in choices:
            raise argparse.ArgumentTypeError(statement(Refusal(path, text, allowed, written=TEXT)))
        return text

    parse.__name__ = "choice"
    return {"type": parse, "metavar": "{" + ",".join(choices) + "}"}


def human_int(allowed: str) -> Callable[[str], int]:
    """An argparse type for an integer in vLLM's human-readable form (``32k``, ``8G``: ``fields.parse_human_int``),
    any value (its range is checked where it is used); other text is refused naming ``allowed``."""
    from attnserve.config.fields import parse_human_int

    return checked(parse_human_int, lambda _: True, allowed)  # type: ignore[arg-type]


def int_at_least(low: int) -> Callable[[str], int]:
    """An integer >= ``low``."""
    return checked(int, lambda v: v >= low, range_words("integer", (">=", low), None))


positive_int = int_at_least(1)
nonnegative_int = int_at_least(0)
port = checked(
    int, lambda v: 0 <= v <= 65535, range_words("integer", (">=", 0), ("<=", 65535)) + "; 0 picks a free port"
)
seconds = checked(
    float, lambda v: math.isfinite(v) and v >= 0, range_words("finite number", (">=", 0), None) + " (seconds)"
)


def output_file(text: str) -> str:
    """A file to write at the end of a run (``--output-json``, ``--plot``): its folder must exist and be
    writable now, so that a long run's results are not lost to a typo in the path."""
    import os

    folder = os.path.dirname(os.path.abspath(text)) if text else ""
    is_dir, exists = bool(text) and os.path.isdir(text), os.path.isdir(folder)
    if text and not is_dir and exists and os.access(folder, os.W_OK | os.X_OK):
        return text
    problem = output_file_problem(text, folder, is_dir, exists)
    raise argparse.ArgumentTypeError(statement(Refusal(value=text, allowed=output_file_words(problem))))
