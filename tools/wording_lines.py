"""Count the source lines that word a refusal, per module: the lines holding text (a string literal or f-string)
given to a refusal's constructor (``Refusal``, ``Reason``, ``Refused`` and its subclasses, ``ArgumentTypeError``,
``OpenAIError``, ``HTTPException``, ``parser.error``, a helper named ``*refus*``/``*error*``/``*fail*``), inside a
``raise`` statement, or given to a ``reason=``/``allowed=``/``advice=``/``noun=``/``subject=`` keyword or a
``"words"`` key (a config field's allowed values); and every text line of ``attnserve/refusals/`` (the one place
the wording should live). Docstrings are not counted.

    python tools/wording_lines.py            # modules by lines, then the totals
    python tools/wording_lines.py --total    # the two totals only
"""

from __future__ import annotations

import ast
import pathlib
import re
import sys

MAKERS = {
    "Refusal",
    "Reason",
    "Refused",
    "ConfigError",
    "RequestValueError",
    "NoUsableBackendError",
    "ArgumentTypeError",
    "OpenAIError",
    "HTTPException",
    "error",  # parser.error(...)
}
KEYWORDS = {"reason", "allowed", "advice", "noun", "subject", "kind"}
ROOT = pathlib.Path(__file__).resolve().parents[1] / "attnserve"
HOME = ROOT / "refusals"


def _name(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")


def _text_lines(node: ast.AST) -> set[int]:
    """The lines of the string literals and f-strings inside ``node``; a bare name (``"role"``, a path's key, a
    field's name) is no wording."""
    lines: set[int] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.JoinedStr) or (
            isinstance(n, ast.Constant) and isinstance(n.value, str) and not _NAME.fullmatch(n.value)
        ):
            lines.update(range(n.lineno, (n.end_lineno or n.lineno) + 1))
    return lines


def _docstrings(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body:
            first = n.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                lines.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
        if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str):
            lines.update(range(n.lineno, (n.end_lineno or n.lineno) + 1))  # attribute docstrings
    return lines


def wording_lines(path: pathlib.Path) -> int:
    tree = ast.parse(path.read_text())
    if HOME in path.parents:
        return len(_text_lines(tree) - _docstrings(tree))
    lines: set[int] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Raise) and n.exc is not None:
            lines |= _text_lines(n.exc)
        if isinstance(n, ast.Dict):
            for k, v in zip(n.keys, n.values):
                if isinstance(k, ast.Constant) and k.value == "words":
                    lines |= _text_lines(v)
        if isinstance(n, ast.Call):
            if _name(n.func) in MAKERS or re.search(r"refus|error|fail", _name(n.func), re.IGNORECASE):
                for a in [*n.args, *(k.value for k in n.keywords)]:
                    lines |= _text_lines(a)
            for k in n.keywords:
                if k.arg in KEYWORDS:
                    lines |= _text_lines(k.value)
    return len(lines - _docstrings(tree))


def main() -> None:
    counts = {p.relative_to(ROOT.parent): wording_lines(p) for p in sorted(ROOT.rglob("*.py"))}
    home = sum(c for p, c in counts.items() if HOME in (ROOT.parent / p).parents)
    elsewhere = sum(counts.values()) - home
    if "--total" not in sys.argv:
        for p, c in sorted(counts.items(), key=lambda pc: -pc[1]):
            if c:
                print(f"{c:5d}  {p}")
    print(f"wording lines in attnserve/refusals/: {home}; elsewhere: {elsewhere}")


if __name__ == "__main__":
    main()
