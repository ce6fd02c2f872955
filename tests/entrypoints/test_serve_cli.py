"""``attnserve serve``'s own flags: a bad value exits 2 with one line before any model loads; an address it cannot
listen on exits 1 with one line, as soon as the flags are read."""

from __future__ import annotations

import pytest

from attnserve.entrypoints.cli.main import main
from tests.helpers import Refuses, assert_cli_refusal


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--port", "99999"],
            Refuses("argument --port", 99999, "integer in [0, 65535]; 0 picks a free port"),
        ),
        (["--port", "-1"], Refuses("argument --port", -1, "integer in [0, 65535]; 0 picks a free port")),
        (
            ["--port", "x"],
            Refuses("argument --port", "x", "integer in [0, 65535]; 0 picks a free port"),
        ),
        (
            ["--shutdown-timeout", "-1"],
            Refuses("argument --shutdown-timeout", -1.0, "finite number >= 0 (seconds)"),
        ),
        (
            ["--shutdown-timeout", "nan"],
            Refuses("argument --shutdown-timeout", float("nan"), "finite number >= 0 (seconds)"),
        ),
        (
            ["--shutdown-timeout", "inf"],
            Refuses("argument --shutdown-timeout", float("inf"), "finite number >= 0 (seconds)"),
        ),
        # a name with no template characters is a file that must exist (vLLM's rule)
        (
            ["--chat-template", "/no/such/template.jinja"],
            "argument --chat-template: '/no/such/template.jinja' cannot be "
            "read ([Errno 2] No such file or directory: '/no/such/template.jinja') (allowed: a Jinja template file, or the "
            "template's text)",
        ),
        (
            ["--default-chat-template-kwargs", "[1]"],
            Refuses("argument --default-chat-template-kwargs", "[1]", "a JSON object"),
        ),
        (
            ["--generation-config", "/no/such/folder"],
            "argument --generation-config: '/no/such/folder' is no folder "
            "(allowed: auto, vllm, or a folder holding a generation_config.json)",
        ),
        (["--max-logprobs", "-2"], Refuses("argument --max-logprobs", -2, "integer >= -1")),
    ],
)
def test_bad_server_flags_exit_2_with_one_line(argv, message, capsys, worded):
    with pytest.raises(SystemExit) as e:
        main(["serve", *argv])
    assert e.value.code == 2
    want = message if isinstance(message, Refuses) else f"attnserve serve: error: {message}"
    assert_cli_refusal(capsys.readouterr().err, "attnserve serve", want, worded)


IN_USE = "Address already in use (another server is running there? pick another port with --port, or --port 0 for a free one)"


def test_a_port_in_use_fails_at_once_with_one_line(capsys):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(["serve", "--port", str(port), "--log-level", "warning"])  # returns before any model loads
    assert code == 1
    err = capsys.readouterr().err.strip()
    assert err == f"attnserve serve: error: cannot listen on 127.0.0.1:{port}: {IN_USE}"


def test_a_port_another_server_has_just_bound_is_the_same_one_line(capsys):
    """Two servers started one after the other on one port: the first holds it from its bind (its socket listens
    at once), so the second fails at its bind with the same line, not later in uvicorn with a traceback. (With
    SO_REUSEADDR, Linux let the second bind too while the first did not listen yet.)"""
    from attnserve.entrypoints.openai.listen import bind_socket

    first = bind_socket("127.0.0.1", 0)
    port = first.getsockname()[1]
    try:
        code = main(["serve", "--port", str(port), "--log-level", "warning"])
    finally:
        first.close()
    assert code == 1
    assert capsys.readouterr().err.strip() == f"attnserve serve: error: cannot listen on 127.0.0.1:{port}: {IN_USE}"


def test_a_port_in_use_is_refused_before_the_models_config_is_read():
    """As a user runs it: the address is bound right after the flags are read, so a port in use is the only line,
    at the default log level, with nothing of the model's checks or load before it (its config check logs the
    attention backend it chose; the trial that found this waited 8.7 s for uvicorn's error once the model had
    loaded, now the model is not even looked at)."""
    import os
    import socket
    import subprocess
    import sys

    from tests.entrypoints.openai.utils import REPO

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "attnserve", "serve", "--port", str(port)],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr == f"attnserve serve: error: cannot listen on 127.0.0.1:{port}: {IN_USE}\n"


def test_an_address_not_of_this_machine_fails_at_once_with_one_line(capsys):
    """192.0.2.1 is TEST-NET-1 (RFC 5737): no machine's interface has it."""
    code = main(["serve", "--host", "192.0.2.1", "--port", "0", "--log-level", "warning"])
    assert code == 1
    assert capsys.readouterr().err == (
        "attnserve serve: error: cannot listen on 192.0.2.1:0: Cannot assign requested address (no network "
        "interface of this machine has that address; pick one with --host, e.g. 127.0.0.1, or 0.0.0.0 for all)\n"
    )


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
