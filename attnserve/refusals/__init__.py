"""Refusals as data: one record for every input attnserve refuses, and the three ways it is written.

The core raises :class:`Refused` (a ``ValueError``) carrying a :class:`Refusal`: where the bad input is
(``path``: ``("block_size",)``, ``("attention_config", "backend")``, ``("prompt", 2)``), the ``value``, what is
``allowed`` in words and, when it is more than "not allowed", the ``reason``. The edges write it:

- :func:`message`: the Python exception's one line, ``block_size 0 not allowed (allowed: integer >= 1)``;
- :func:`cli_line`: the command line's, ``argument --block-size: 0 not allowed (allowed: ...)`` (exit status 2),
  from the record :meth:`Refusal.at` places where the value was given;
- :func:`openai_error`: the server's 400, ``(message, param)``: ``prompt.2: 50000 not allowed (...)``, ``prompt.2``.

A message is made once, from the record; nothing rewrites it, and control flow reads types and fields, never text.
The selector's reasons are :class:`Reason` records (field, value, rule). This module imports no other attnserve
module, so every package may use it.
"""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass


class _Marker:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name

    def __reduce__(self) -> str:  # unpickles as the module's one marker, so that ``is`` holds across processes
        return self.name


NO_VALUE = _Marker("NO_VALUE")
"""A refusal that quotes no value (a malformed file, an unknown key)."""
MISSING = _Marker("MISSING")
"""The value of a required key that is absent: ``messages[0].content missing (required: ...)``."""

# how a value is written: as Python does (a keyword argument), as a config file or flag does, as the JSON body sent
PYTHON, TEXT, JSON = "python", "text", "json"


@dataclass(frozen=True)
class Refusal:
    """One refused input. The words are the fields'; :func:`message` composes the line:
    ``[origin: ][subject ]VALUE VERB[ (allowed: ALLOWED)][; advice][; did you mean 'x'?]``."""

    path: tuple[str | int, ...] = ()
    """The setting or request field: names and list indexes from the top (``("messages", 0, "content")``)."""
    value: object = NO_VALUE
    """The value refused; NO_VALUE when the refusal quotes none, MISSING for an absent required key."""
    allowed: str | None = None
    """What is allowed, in words."""
    reason: str | None = None
    """Why, when it is more than "not allowed": after the value (``3 cannot split 4 query heads ...``), or the
    whole statement when there is no value (``malformed YAML: ...``)."""
    noun: str | None = None
    """What the value is not, for a value of another kind: ``an integer`` (``'x' is not an integer``)."""
    kind: str | None = None
    """What the value is, with ``noun``: ``'32' is a string, not an integer``."""
    subject: str | None = None
    """The words naming what is refused when they are not the path's: ``attention backend``, ``unknown key``."""
    advice: str = ""
    """What to change; engine arguments in braces (``raise {kv_cache_memory}``), each surface names them."""
    suggestion: str | None = None
    """The closest valid name: ``; did you mean 'FLASH_ATTN'?``."""
    key: str | None = None
    """The engine argument to blame, for the CLI to name its flag (a ConfigError without one: its path's)."""
    origin: str = ""
    """Where the value was given, as a line names it: ``argument --block-size``, ``cfg.yaml``, ``cfg.yaml:2:1``."""
    names_path: bool = False
    """``origin`` names the setting already (a flag of its own): the line does not name it again."""
    written: str = PYTHON
    """How the value is spelled: PYTHON (``True``, ``None``), TEXT (a file or flag: ``true``, ``null``), JSON."""

    @property
    def setting(self) -> str | None:
        """The engine argument the refusal is about: ``key``, else the path dotted when it is all names."""
        if self.key is not None:
            return self.key
        return ".".join(self.path) if self.path and all(isinstance(p, str) for p in self.path) else None  # type: ignore[arg-type]

    def at(self, origin: str, names_path: bool = False, written: str = TEXT) -> Refusal:
        """This refusal given at ``origin`` (a flag, a file), its value spelled as it is ``written`` there."""
        return dataclasses.replace(self, origin=origin, names_path=names_path, written=written)


class Refused(ValueError):
    """An input attnserve refuses; ``refusal`` holds the record, ``str()`` is :func:`message`'s line."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal)  # args: the record, so that a pickled refusal (a worker's, a Ray actor's) is rebuilt
        self.refusal = refusal

    def __str__(self) -> str:
        return message(self.refusal)

    def reduce_from_record(self):
        """``__reduce__`` for a subclass whose arguments are its own (not the record): rebuilt from the record."""
        return _rebuild, (type(self), self.refusal), self.__dict__

    @property
    def key(self) -> str | None:
        """The engine argument to blame (the CLI names its flag): the record's ``key``; a config refusal's path too."""
        return self.refusal.key

    @property
    def path(self) -> tuple[str | int, ...]:
        return self.refusal.path

    @property
    def value(self) -> object:
        return self.refusal.value

    @property
    def allowed(self) -> str | None:
        return self.refusal.allowed


def _rebuild(cls: type[Refused], refusal: Refusal) -> Refused:
    error = cls.__new__(cls)
    Refused.__init__(error, refusal)
    return error


class Reason(str):
    """One reason a backend cannot run a model: its text, and the record it says (``field``: the selector-config
    or attention-config field, ``device``, ``compute_capability``, ``package`` or ``build`` (the installed
    library's build lacks what every call needs); the ``value``; the ``rule``; ``build``: the limit is the
    installed library's build's, not the backend's)."""

    field: str
    value: object
    rule: str
    build: bool

    def __new__(cls, text: str, field: str, value: object = None, rule: str = "", build: bool = False) -> Reason:
        self = super().__new__(cls, text)
        self.field, self.value, self.rule, self.build = field, value, rule, build
        return self

    def __reduce__(self):  # pickles (worker processes) as the record, not as plain text
        return Reason, (str(self), self.field, self.value, self.rule, self.build)


# ---------------------------------------------------------------- writing values and places


def spell_value(value: object) -> str:
    """``value`` as a YAML or JSON config file (or a JSON option such as ``-ac``) writes it: ``true``, ``null``,
    numbers as Python writes them, text quoted (``'fp9'``), a date as written, a list or mapping as JSON."""
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


def json_value(value: object) -> str:
    """``value`` as the client wrote it in JSON (a number past a float's range as sent: its ``text``), cut to 60
    characters."""
    text = getattr(value, "text", None)
    if isinstance(value, float) and isinstance(text, str):
        return text
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_SPELL: dict[str, Callable[[object], str]] = {PYTHON: repr, TEXT: spell_value, JSON: json_value}


def python_path(path: tuple[str | int, ...]) -> str:
    """The place as Python indexes it: ``prompt[2]``, ``messages[1][0].content``, ``attention_config.backend``."""
    if not path:
        return ""
    head, *rest = path
    return str(head) + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in rest)


def dotted_path(path: tuple[str | int, ...]) -> str:
    """The place as the server's ``param`` writes it: ``prompt.2``, ``messages.1.0.content``."""
    return ".".join(map(str, path))


_ADVICE_NAME = re.compile(r"\{([a-z_][a-z0-9_.]*)\}")


def statement(r: Refusal, names: Mapping[str, str] | Callable[[str], str] | None = None) -> str:
    """The refusal without its place: ``0 not allowed (allowed: integer >= 1)``, ``'x' is not an integer``,
    ``missing (required: a string)``; the advice's engine arguments named by ``names`` (default: as they are)."""
    spell = _SPELL.get(r.written, repr)
    if r.value is MISSING:
        text = f"missing (required: {r.allowed})" if r.allowed else "missing (required)"
    else:
        if r.noun and r.kind:
            verb = f"is {r.kind}, not {r.noun}"
        elif r.noun:
            verb = f"is not {r.noun}"
        else:
            verb = r.reason if r.reason is not None else "not allowed"
        text = verb if r.value is NO_VALUE else f"{spell(r.value)} {verb}".rstrip()
        if r.allowed:
            text += f" (allowed: {_allowed(r)})"
    if r.advice:
        name = names if callable(names) else (lambda k: (names or {}).get(k, k))  # type: ignore[union-attr]
        text += (" " if text.endswith(".") else "; ") + _ADVICE_NAME.sub(lambda m: name(m.group(1)), r.advice)
    if r.suggestion:
        text += f"; did you mean {r.suggestion!r}?"
    return text


def _allowed(r: Refusal) -> str:
    """The allowed values in the surface's spelling: a JSON client reads "or null" where Python reads "or None"."""
    return r.allowed.replace(", or None", ", or null") if r.written == JSON else r.allowed


# ---------------------------------------------------------------- the three surfaces


def message(r: Refusal, names: Mapping[str, str] | Callable[[str], str] | None = None) -> str:
    """The one line of a Python exception (and, with an ``origin``, of the CLI): ``block_size 0 not allowed
    (allowed: ...)``, ``cfg.yaml: block_size 0 not allowed (...)``, ``argument --block-size: 0 not allowed (...)``."""
    subject = "" if r.names_path else (r.subject if r.subject is not None else python_path(r.path))
    text = statement(r, names)
    line = f"{subject} {text}" if subject else text
    return f"{r.origin}: {line}" if r.origin else line


def cli_line(prog: str, r: Refusal, names: Mapping[str, str] | Callable[[str], str] | None = None) -> str:
    """The command line's error: ``PROG: error: LINE`` (argparse's form, exit status 2), the advice's engine
    arguments named by ``names`` (default: their flags)."""
    return f"{prog}: error: {message(r, names or flag)}"


def flag(key: str) -> str:
    """The flag of engine argument ``key``: ``--block-size``, ``--attention-config.backend``."""
    return (
        "--" + key.replace("_", "-")
        if "." not in key
        else "--" + key.split(".", 1)[0].replace("_", "-") + "." + key.split(".", 1)[1]
    )


def openai_error(r: Refusal, param: str | None = None) -> tuple[str, str | None]:
    """The server's 400 as (message, param): the place dotted as ``param`` (or ``param`` when given) and the value
    as JSON: ``("prompt.2: 50000 not allowed (allowed: ...)", "prompt.2")``."""
    r = (
        dataclasses.replace(r, written=JSON, origin="", names_path=True)
        if r.path
        else dataclasses.replace(r, written=JSON)
    )
    where = dotted_path(r.path) if r.path else None
    text = message(r)
    return (f"{where}: {text}" if where else text), (param if param is not None else where)


# ---------------------------------------------------------------- words shared by the refusals


def closest(name: str, choices: Iterable[str]) -> str | None:
    """The closest of ``choices`` to ``name``, or None when none is close."""
    match = difflib.get_close_matches(name, list(choices), n=1)
    return match[0] if match else None


def range_words(kind: str, low: tuple[str, object] | None, high: tuple[str, object] | None) -> str:
    """A number's allowed range in words: ``integer in [0, 255]``, ``number in (0, 1]``, ``integer >= 1``, or
    ``kind`` alone; ``low`` with ">=" or ">", ``high`` with "<=" or "<"."""
    if low and high:
        return f"{kind} in {'[' if low[0] == '>=' else '('}{low[1]}, {high[1]}{']' if high[0] == '<=' else ')'}"
    if low or high:
        op, value = low or high  # type: ignore[misc]
        return f"{kind} {op} {value}"
    return kind


def kind_of(value: object) -> str:
    """What a value read from a config file (or given in Python) is: ``a string``, ``an integer``, ``a float``, ``a
    boolean``, ``a list``, ``a mapping``, ``a date``; otherwise its Python type's name."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, datetime.date):
        return "a date"
    for tp, words in (
        (int, "an integer"),
        (float, "a float"),
        (str, "a string"),
        (list, "a list"),
        (dict, "a mapping"),
    ):
        if isinstance(value, tp):
            return words
    return f"a {type(value).__name__}"
