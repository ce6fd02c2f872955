"""Lark grammars as xgrammar's EBNF: vLLM's ``guided_grammar`` takes either (its xgrammar backend converts Lark), so
requests written for vLLM's Lark examples run here too.

What converts: rule and terminal definitions (``name: ...``, ``?name: ...``, ``NAME: ...``), alternatives on
continuation lines (``| ...``), ``//`` comments, string literals, ``"a".."z"`` ranges, groups and the
``?`` / ``*`` / ``+`` operators (the same in both); ``start`` becomes xgrammar's ``root``. What does not (a regex
terminal ``/.../``, ``%import`` / ``%ignore`` and other directives, rule templates, priorities such as ``NAME.2``)
raises :class:`LarkError` naming it, so the caller refuses the grammar instead of compiling something else.
"""

from __future__ import annotations

import re

_DEF = re.compile(r"^\s*\??([A-Za-z_]\w*)\s*:(?!:)(.*)$")  # name: body (not name ::= body)
_RANGE = re.compile(r'"(\\.|[^"\\])"\.\."(\\.|[^"\\])"')
# a range or a string literal, whole: what a body's code (rule names, operators) is read around
_LITERALS = re.compile(r'("(?:\\.|[^"\\])"\.\."(?:\\.|[^"\\])"|"(?:\\.|[^"\\])*")')
_START = re.compile(r"\bstart\b")


class LarkError(ValueError):
    """A Lark feature with no EBNF form here; the message names it and its line."""


def is_lark(grammar: str) -> bool:
    """Whether ``grammar`` reads as Lark rather than EBNF: no ``::=`` and a ``name: ...`` definition line (vLLM's
    test)."""
    return "::=" not in grammar and any(_DEF.match(line) for line in grammar.splitlines())


def _code(line: str) -> str:
    """``line`` without a ``//`` comment outside string literals and regexes."""
    quote = None
    i = 0
    while i < len(line):
        ch = line[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = None
        elif ch in "\"'/" and not line.startswith("//", i):
            quote = ch
        elif line.startswith("//", i):
            return line[:i]
        i += 1
    return line


def _body(body: str, lineno: int) -> str:
    """One definition's expansion in EBNF: ranges as character classes, ``start`` as ``root`` (string literals
    kept as they are: ``"start"``, ``"a/b"``)."""
    out = []
    for i, part in enumerate(_LITERALS.split(body.strip())):
        if i % 2:  # a literal or a range
            m = _RANGE.fullmatch(part)
            out.append(f"[{m.group(1)}-{m.group(2)}]" if m else part)
        elif "/" in part:
            raise LarkError(f"line {lineno}: a regex terminal (/.../) has no EBNF form here; write it with strings")
        else:
            out.append(_START.sub("root", part))
    return "".join(out)


def lark_to_ebnf(grammar: str) -> str:
    """``grammar`` (Lark) as xgrammar EBNF; :class:`LarkError` for what has no EBNF form (module docstring)."""
    rules: list[list[str]] = []
    for lineno, raw in enumerate(grammar.splitlines(), 1):
        line = _code(raw).rstrip()
        if not line.strip():
            continue
        if line.lstrip().startswith("%"):
            raise LarkError(f"line {lineno}: the directive {line.strip().split()[0]!r} is not supported")
        m = _DEF.match(line)
        if m:
            name = "root" if m.group(1) == "start" else m.group(1)
            rules.append([f"{name} ::= {_body(m.group(2), lineno)}"])
        elif line.lstrip().startswith("|") and rules:
            rules[-1].append(f"| {_body(line.lstrip()[1:], lineno)}")
        else:
            raise LarkError(f"line {lineno}: {line.strip()!r} is neither a definition nor a continuation (| ...)")
    if not any(r[0].startswith("root ::=") for r in rules):
        raise LarkError("no 'start' rule")
    return "\n".join(" ".join(r) for r in rules)
