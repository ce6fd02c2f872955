"""StructuredOutputsParams: the one constraint a request's output must meet (vLLM's record and field names).

Exactly one of ``json`` (a JSON schema, as a dict or its JSON text), ``regex``, ``choice`` (a list of strings),
``grammar`` (EBNF, as xgrammar and llama.cpp's GBNF write it) or ``json_object`` (any JSON object) is set. The
record only holds and checks the values; compiling them (``attnserve/structured_output/``) needs xgrammar
(``pip install 'attnserve[structured]'``) and reports an invalid schema, regex or grammar.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields

from attnserve.refusals import Refusal, Refused
from attnserve.refusals.sampling import (  # noqa: F401 (KINDS, ONE_KIND re-exported)
    KIND_WORDS,
    KINDS,
    ONE_KIND,
    TRUE_OR_FALSE,
    not_one_kind,
    unknown_constraint_key,
)


@dataclass(frozen=True)
class StructuredOutputsParams:
    """One request's output constraint. Raises :class:`Refused` (path ``structured_outputs``...) for none or
    several kinds, or a value of the wrong type."""

    json: str | dict | None = None  # a JSON schema (dict, or its JSON text)
    regex: str | None = None
    choice: list[str] | None = None  # the output is exactly one of these strings
    grammar: str | None = None  # EBNF with a ``root`` rule
    json_object: bool | None = None  # True: any JSON object
    disable_any_whitespace: bool = False  # JSON: no whitespace between tokens (compact output)

    def __post_init__(self) -> None:
        given = [k for k in KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise Refused(not_one_kind({k: getattr(self, k) for k in given}))
        kind = given[0]
        value = getattr(self, kind)
        ok = {
            "json": isinstance(value, (str, dict)),
            "regex": isinstance(value, str),
            "choice": isinstance(value, (list, tuple)) and len(value) > 0 and all(isinstance(c, str) for c in value),
            "grammar": isinstance(value, str) and value.strip() != "",
            "json_object": value is True,
        }[kind]
        if not ok:
            raise Refused(Refusal(("structured_outputs", kind), value, KIND_WORDS[kind]))
        if kind == "choice":
            object.__setattr__(self, "choice", list(value))
        if not isinstance(self.disable_any_whitespace, bool):
            raise Refused(
                Refusal(("structured_outputs", "disable_any_whitespace"), self.disable_any_whitespace, TRUE_OR_FALSE)
            )

    @classmethod
    def from_dict(cls, d: dict, path: tuple[str | int, ...] = ("structured_outputs",)) -> StructuredOutputsParams:
        """From a request's object (the server's ``structured_outputs``); an unknown key is refused by name."""
        names = [f.name for f in fields(cls)]
        unknown = [k for k in d if k not in names]
        if unknown:
            raise Refused(unknown_constraint_key(path, unknown[0], d[unknown[0]], names))
        return cls(**d)

    @property
    def kind(self) -> str:
        """Which of :data:`KINDS` is set."""
        return next(k for k in KINDS if getattr(self, k) not in (None, False))

    @property
    def source(self) -> str:
        """The constraint as text: the grammar cache's key with :attr:`kind` and the whitespace option."""
        value = getattr(self, self.kind)
        if self.kind == "json" and isinstance(value, dict):
            return json.dumps(value, sort_keys=True)
        if self.kind == "choice":
            return json.dumps(value)
        return str(value)
