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
import functools
import inspect
import re
import textwrap
import types
import typing

from attnserve.refusals import Refusal, Refused, closest, kind_of, range_words, spell_value  # noqa: F401 (re-exported)
from attnserve.refusals.config import HUMAN_INT_WORDS, TYPE_NOUNS, field_words  # noqa: F401 (re-exported)
from attnserve.refusals.config import unknown_record_field


class ConfigError(Refused):
    """A configuration value or key that is not allowed: a :class:`~attnserve.refusals.Refused` whose record names
    the setting (``path``, or ``key`` for a refusal about a setting that quotes no value), the value and what is
    allowed. ``ConfigError("text", key=...)`` is a refusal whose whole statement is the text."""

    def __init__(self, refusal: Refusal | str, key: str | None = None) -> None:
        super().__init__(refusal if isinstance(refusal, Refusal) else Refusal(reason=refusal, key=key))

    @property
    def key(self) -> str | None:
        """The engine argument refused: the record's ``key``, else its path (``attention_config.backend``)."""
        return self.refusal.setting


def refuses_unknown_keywords(refusal: typing.Callable[[object, list[str], str | None], Refusal] | None = None):
    """Class decorator of a config record: a keyword that names none of its fields raises ConfigError (``refusal(key,
    fields, closest field)``; default :func:`~attnserve.refusals.config.unknown_record_field` naming the class), as an
    unknown key of a file or ``-ac`` is refused, not with the generated ``__init__``'s bare TypeError. A field's vLLM
    alias (``num_gpu_blocks_override``) suggests the field."""

    def decorate(cls: type) -> type:
        def __new__(klass: type, *args: object, **kwargs: object) -> object:
            fields = dataclasses.fields(klass)  # type: ignore[arg-type]
            valid = [f.name for f in fields]
            aliases = {a: f.name for f in fields for a in f.metadata.get("aliases", ())}
            for key in kwargs:
                if key not in valid:
                    name = str(key).replace("-", "_")
                    suggestion = aliases.get(name) or closest(name, valid)
                    make = refusal or functools.partial(unknown_record_field, klass.__name__)
                    raise ConfigError(make(key, valid, suggestion))
            return object.__new__(klass)

        cls.__new__ = staticmethod(__new__)  # type: ignore[assignment]
        return cls

    return decorate


def setting_path(key: str) -> tuple[str, ...]:
    """``"attention_config.backend"`` -> ``("attention_config", "backend")``: a setting's path in a Refusal."""
    return tuple(key.split("."))


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


def allowed_values(cls: type, name: str) -> str:
    """The allowed values of field ``name`` of ``cls`` in words, e.g. ``"integer >= 1"``, ``"2, 3, 4, null"``,
    ``"integer >= 1 (bytes), null"``."""
    base, optional = split_optional(field_types(cls)[name])
    return field_words(base, optional, cls.__dataclass_fields__[name].metadata)  # type: ignore[arg-type]


# vLLM's human_readable_int (vllm/engine/arg_utils.py): lowercase suffixes are decimal, uppercase binary, and
# only a decimal suffix takes a fraction ('25.6k'); the flags --max-model-len, --max-num-batched-tokens and
# --kv-cache-memory-bytes take it there
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


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
        if value is not None and not _type_ok(value, base) and base in TYPE_NOUNS:
            # the type first: "'32' not allowed (allowed: 1, 2, 4, ..., 32, ...)" would deny what the list shows
            raise ConfigError(
                Refusal(
                    setting_path(key), value, allowed_values(cls, f.name), kind=kind_of(value), noun=TYPE_NOUNS[base]
                )
            )  # type: ignore[index]
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
            raise ConfigError(Refusal(setting_path(key), value, allowed_values(cls, f.name)))
        if base is float and isinstance(value, int):
            object.__setattr__(obj, f.name, float(value))
