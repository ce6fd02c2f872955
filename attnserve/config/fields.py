"""What the config records share: ConfigError, field docstrings (CLI help) and per-field validation.

A config field is declared once, on its dataclass: its type annotation, its default, an attribute
docstring (read here with ``ast``; it becomes the CLI help), and optional metadata with the allowed
values (``choices``, ``ge``, ``gt``, ``le``; ``words``: the allowed values in words, when they are better
said otherwise than as the bounds' digits, or for values the field's own check judges, as ``device``'s), the
``unit`` of a number (``"bytes"``), vLLM's other spellings of its name (``aliases``: flags, file keys and
keywords) and whether the command line and config files take it with vLLM's size suffixes
(``human_readable``: ``32k``, ``8G``; :func:`parse_human_int`).
``validate_fields`` checks every field against that declaration, so the records, the CLI, the config files
and the Python API all enforce the same rules.
"""

from __future__ import annotations

import ast
import dataclasses
import datetime
import re
import difflib
import functools
import inspect
import json
import textwrap
import types
import typing


_NO_VALUE = object()


def spell_value(value: object) -> str:
    """``value`` as a YAML or JSON config file (or a JSON option such as ``-ac``) writes it, for an error about a
    value read from one: ``true``, ``false``, ``null``, numbers as Python writes them (``1000.0``), text quoted as
    every error quotes it (``'fp9'``), a YAML date as written (``2024-01-01``), a list or mapping as JSON (``[1,
    true]``); anything else as Python writes it."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, datetime.date):  # datetime too: '2024-01-01 10:00:00', YAML's spelling
        return str(value)
    if isinstance(value, (list, dict)):
        try:
            return json.dumps(value, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError):  # a date, a non-finite number inside: Python's spelling
            pass
    return repr(value)


class ConfigError(ValueError):
    """A configuration value or key that is not allowed; the message names it and what is allowed.

    ``key`` is the engine argument the error is about (``"block_size"``, ``"attention_config.backend"``)
    when there is one; the argument layer uses it to name the flag or file the value came from. ``value``, when
    given, is the value the message quotes as Python writes it (``repr``): the argument layer respells it as the
    config file or JSON option it came from writes it (:meth:`spelled`).
    """

    def __init__(self, message: str, key: str | None = None, value: object = _NO_VALUE) -> None:
        super().__init__(message)
        self.key = key
        self.value = value

    def spelled(self) -> ConfigError:
        """This error with its quoted value as a config file writes it (:func:`spell_value`: ``true``, not
        ``True``; ``null``, not ``None``); itself when that is the same or it quotes no value."""
        if self.value is _NO_VALUE or repr(self.value) == spell_value(self.value):
            return self
        return ConfigError(str(self).replace(repr(self.value), spell_value(self.value), 1), self.key, self.value)


def without_name(message: str, *keys: str | None) -> str:
    """``message`` without the setting name it starts with (one of ``keys``, its last dotted part, or either in
    words: ``attention backend``), for a line whose prefix names that setting already: ``block_size 0 not
    allowed (allowed: integer >= 1)`` becomes ``argument --block-size: 0 not allowed (allowed: integer >= 1)``.
    A message that starts otherwise is kept."""
    for key in filter(None, keys):
        for name in (key, key.rsplit(".", 1)[-1]):
            for spelled in (name, name.replace("_", " ")):
                if message.startswith(spelled + " "):
                    return message[len(spelled) + 1:]
    return message


def did_you_mean(name: str, choices: typing.Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest of ``choices``, or ``""`` when none is close."""
    match = difflib.get_close_matches(name, list(choices), n=1)
    return f"; did you mean {match[0]!r}?" if match else ""


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings of a dataclass, whitespace-collapsed: ``{field name: doc}``."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):  # no source (frozen app): help falls back to the field name
        return {}
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for node, nxt in zip(body, body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


@functools.cache
def field_types(cls: type) -> dict[str, object]:
    """Resolved type annotations of a dataclass's fields."""
    return typing.get_type_hints(cls)


def split_optional(tp: object) -> tuple[object, bool]:
    """``int | None`` -> ``(int, True)``; ``int`` -> ``(int, False)``."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], len(args) < len(typing.get_args(tp))
    return tp, False


_TYPE_WORDS = {bool: "true, false", int: "integer", float: "number", str: "string"}


def range_words(kind: str, low: tuple[str, object] | None, high: tuple[str, object] | None) -> str:
    """A number's allowed range in words: ``kind`` ("integer", "number") and its bounds as (operator, value),
    ``low`` with ">=" or ">", ``high`` with "<=" or "<": ``integer in [0, 18446744073709551615]``, ``number in
    (0, 1]``, ``integer >= 1``, or ``kind`` alone. Config fields (:func:`allowed_values`) and the server's request
    fields (``entrypoints/openai/allowed.py``) say their ranges with it."""
    if low and high:
        return f"{kind} in {'[' if low[0] == '>=' else '('}{low[1]}, {high[1]}{']' if high[0] == '<=' else ')'}"
    if low or high:
        op, value = low or high  # type: ignore[misc]
        return f"{kind} {op} {value}"
    return kind


def allowed_values(cls: type, name: str) -> str:
    """The allowed values of field ``name`` of ``cls`` in words, e.g. ``"integer >= 1"``, ``"2, 3, 4, null"``,
    ``"integer >= 1 (bytes), null"``."""
    f = cls.__dataclass_fields__[name]
    base, optional = split_optional(field_types(cls)[name])
    meta = f.metadata
    if "words" in meta:
        words = meta["words"]
    elif "choices" in meta:
        words = ", ".join(str(c) for c in meta["choices"])
    else:
        low = next(((op, meta[k]) for k, op in (("gt", ">"), ("ge", ">=")) if k in meta), None)
        words = range_words(_TYPE_WORDS.get(base, getattr(base, "__name__", str(base))), low,
                            ("<=", meta["le"]) if "le" in meta else None)
        if "unit" in meta:
            words += f" ({meta['unit']})"
    return words + (", null" if optional else "")


# vLLM's human_readable_int (vllm/engine/arg_utils.py): lowercase suffixes are decimal, uppercase binary, and
# only a decimal suffix takes a fraction ('25.6k'); the flags --max-model-len, --max-num-batched-tokens and
# --kv-cache-memory-bytes take it there
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
HUMAN_INT_WORDS = ("suffixes as in vLLM: k, m, g, t = 10^3, 10^6, 10^9, 10^12 (with a fraction: 1.5k); "
                   "K, M, G, T = 2^10, 2^20, 2^30, 2^40 (whole numbers only)")
"""What :func:`parse_human_int` takes beyond a plain integer, for the allowed-values words of its errors."""


def parse_human_int(text: str) -> int:
    """An integer written as vLLM's ``human_readable_int`` takes it: ``4096``, ``32k`` (32000), ``32K`` (32768),
    ``25.6k`` (25600), ``8G`` (8 GiB). Raises ValueError for anything else (``1GiB``, ``1.5K``, ``x``)."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kmgtKMGT])", text.strip())
    if match is None:
        return int(text)
    number, suffix = match.groups()
    if suffix in _DECIMAL:
        return int(float(number) * _DECIMAL[suffix])
    return int(number) * _BINARY[suffix]  # '1.5K': ValueError, as in vLLM (a fraction of a binary unit)


_EXPECTED = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}


def kind_of(value: object) -> str:
    """What a value read from a config file (or given in Python) is, in words: ``a string``, ``an integer``, ``a
    float``, ``a boolean``, ``a list``, ``a mapping``, ``a date``; otherwise its Python type's name."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, datetime.date):
        return "a date"
    for kind, words in ((int, "an integer"), (float, "a float"), (str, "a string"), (list, "a list"),
                        (dict, "a mapping")):
        if isinstance(value, kind):
            return words
    return f"a {type(value).__name__}"


def _type_ok(value: object, base: object) -> bool:
    if base is bool:
        return isinstance(value, bool)
    if base is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if base is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(base, type):
        return isinstance(value, base)
    return True


def validate_fields(obj: object, prefix: str = "") -> None:
    """Check every field of the frozen dataclass ``obj`` against its type and metadata.

    Integers given for float fields become floats. Raises ConfigError naming ``prefix + name``, the
    value and the allowed values; a value of another type, also its type and the one expected (``block_size '32'
    is a string, not an integer (allowed: 1, 2, 4, ...)``). A null where none is allowed is ``not allowed``.
    """
    cls = type(obj)
    for f in dataclasses.fields(obj):  # type: ignore[arg-type]
        value = getattr(obj, f.name)
        base, optional = split_optional(field_types(cls)[f.name])
        if value is None and optional:
            continue
        meta = f.metadata
        key = prefix + f.name
        if value is not None and not _type_ok(value, base) and base in _EXPECTED:
            # the type first: "'32' not allowed (allowed: 1, 2, 4, ..., 32, ...)" would deny what the list shows
            raise ConfigError(f"{key} {value!r} is {kind_of(value)}, not {_EXPECTED[base]} "  # type: ignore[index]
                              f"(allowed: {allowed_values(cls, f.name)})", key=key, value=value)
        ok = _type_ok(value, base)
        if ok and "choices" in meta:
            ok = value in meta["choices"]
        if ok and not isinstance(value, bool) and isinstance(value, (int, float)):
            ok = (
                ("ge" not in meta or value >= meta["ge"])
                and ("gt" not in meta or value > meta["gt"])
                and ("le" not in meta or value <= meta["le"])
            )
        if not ok:
            raise ConfigError(f"{key} {value!r} not allowed (allowed: {allowed_values(cls, f.name)})", key=key, value=value)
        if base is float and isinstance(value, int):
            object.__setattr__(obj, f.name, float(value))
