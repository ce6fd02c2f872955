"""Every ``attnserve ...`` line of the README's and docs' bash blocks parses: a new user copies them."""

from __future__ import annotations

import pathlib
import re
import shlex

import pytest

from attnserve.entrypoints.cli.main import build_parser

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _commands() -> list[tuple[str, str]]:
    """(file, command line) for each ``attnserve`` line of a bash block; usage synopses (``[MODEL]``) left out."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for block in re.findall(r"```bash\n(.*?)```", path.read_text(), re.S):
            for line in block.replace("\\\n", " ").splitlines():
                line = line.strip()
                if line.startswith("attnserve ") and "[" not in line.split("#")[0]:
                    found.append((path.name, line))
    return found


COMMANDS = _commands()


def test_the_docs_have_commands():
    assert len(COMMANDS) > 20


@pytest.mark.parametrize("where,line", COMMANDS, ids=[f"{w}:{line[:60]}" for w, line in COMMANDS])
def test_documented_command_parses(where, line, capsys):
    argv = shlex.split(line, comments=True)[1:]
    argv = argv[
        : next((i for i, a in enumerate(argv) if a[:1] in (">", "|")), len(argv))
    ]  # `> cfg.json`, `| head`: the shell's
    try:
        build_parser(argv[0]).parse_args(argv)
    except SystemExit:
        pytest.fail(f"{where}: {line!r} does not parse: {capsys.readouterr().err.strip()}")
