"""``attnserve serve``'s own flags: a bad value exits 2 with one line before any model loads."""

from __future__ import annotations

import pytest

from attnserve.entrypoints.cli.main import main


@pytest.mark.parametrize("argv, message", [
    (["--port", "99999"], "argument --port: 99999 not allowed (allowed: integer in [0, 65535]; 0 picks a free port)"),
    (["--port", "-1"], "argument --port: -1 not allowed (allowed: integer in [0, 65535]; 0 picks a free port)"),
    (["--port", "x"], "argument --port: 'x' is not an integer (allowed: integer in [0, 65535]; 0 picks a free port)"),
    (["--shutdown-timeout", "-1"], "argument --shutdown-timeout: -1.0 not allowed (allowed: finite number >= 0 (seconds))"),
    (["--shutdown-timeout", "nan"], "argument --shutdown-timeout: nan not allowed (allowed: finite number >= 0 (seconds))"),
    (["--shutdown-timeout", "inf"], "argument --shutdown-timeout: inf not allowed (allowed: finite number >= 0 (seconds))"),
])
def test_bad_server_flags_exit_2_with_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(["serve", *argv])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip() == f"attnserve serve: error: {message}"


def test_a_port_in_use_fails_at_once_with_one_line(capsys):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(["serve", "--port", str(port), "--log-level", "warning"])  # returns before any model loads
    assert code == 1
    err = capsys.readouterr().err.strip()
    assert err == f"attnserve serve: error: cannot listen on 127.0.0.1:{port}: Address already in use"


def test_held_logs_log_a_passing_checks_records_and_drop_a_refusals(caplog):
    """serve's config check runs in ``held_logs``: its log lines (the attention backend it chose) go out once it
    passes, in order; a refusal drops them, so that its error line is the only line."""
    import logging

    from attnserve.entrypoints.cli.held_logs import held_logs

    log = logging.getLogger("attnserve.test_held_logs")
    with caplog.at_level(logging.INFO):
        with held_logs():
            log.info("first")
            log.warning("second")
            assert caplog.records == []  # held
        with pytest.raises(ValueError), held_logs():
            log.info("refused")
            raise ValueError("the check refused")
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [("INFO", "first"), ("WARNING", "second")]
