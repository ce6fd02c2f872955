"""``attnserve`` itself: with no command it lists the commands (exit 2, as any usage error)."""

from __future__ import annotations

from attnserve.entrypoints.cli.main import COMMANDS
from attnserve.entrypoints.cli.main import main as attnserve_main


def test_no_command_prints_the_commands_and_exits_2(capsys):
    assert attnserve_main([]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("usage: attnserve")
    for name, (_, help_text) in COMMANDS.items():
        assert name in captured.err and help_text.split()[0] in captured.err
