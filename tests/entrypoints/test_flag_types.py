"""Every int or float flag of every subcommand: text that is not its type exits 2 with one line naming the flag,
the text and what is allowed (``argument --seed: 'abc' is not an integer``, ``argument --max-tokens: '1.5' is
not an integer (allowed: integer >= 1)``), not argparse's ``invalid int value: 'abc'``."""

from __future__ import annotations

import argparse
import re

import pytest

from attnserve.entrypoints.cli.main import COMMANDS, build_parser, main
from tests.helpers import Refuses, assert_cli_refusal


def _parsers(parser: argparse.ArgumentParser, argv: list[str]):
    """``(argv to reach it, parser)`` for ``parser`` and every subcommand parser under it."""
    yield argv, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, [*argv, name])


def _flags() -> list[tuple[list[str], str, argparse.Action]]:
    found = []
    for command in COMMANDS:
        top = build_parser(command)
        for argv, parser in _parsers(top, []):
            if not argv or argv[0] != command:
                continue
            for action in parser._actions:
                if action.option_strings and action.type is not None:
                    found.append((argv, action.option_strings[0], action))
    return found


FLAGS = _flags()


def _rejects(action: argparse.Action, text: str) -> bool:
    try:
        action.type(text)  # type: ignore[misc]
    except argparse.ArgumentTypeError:
        return True
    return False


# the flags that take text and refuse "x" as such: a file or a template, JSON
TEXT_FLAGS = {"--chat-template", "--default-chat-template-kwargs"}
CHOICES = [(argv, flag) for argv, flag, action in FLAGS if getattr(action.type, "__name__", "") == "choice"]
NUMERIC = [
    (argv, flag)
    for argv, flag, action in FLAGS
    if _rejects(action, "x") and flag not in TEXT_FLAGS and (argv, flag) not in CHOICES
]


def test_no_flag_is_a_bare_int_or_float():
    """A bare ``type=int`` says ``invalid int value: 'x'``, naming nothing allowed."""
    bare = [" ".join([*argv, flag]) for argv, flag, action in FLAGS if action.type in (int, float)]
    assert bare == []


def test_the_numeric_flags_of_every_command_are_covered():
    commands = {" ".join(argv) for argv, _ in NUMERIC}
    assert {"generate", "serve", "bench serve", "bench throughput", "bench latency", "bench attention"} <= commands
    assert len(NUMERIC) > 60


@pytest.mark.parametrize("argv, flag", NUMERIC, ids=[" ".join([*a, f]) for a, f in NUMERIC])
def test_text_that_is_not_a_number_names_the_flag_and_what_is_allowed(argv, flag, capsys):
    with pytest.raises(SystemExit) as e:
        main([*argv, flag, "x"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert re.fullmatch(
        rf"attnserve {' '.join(argv)}: error: argument {re.escape(flag)}: 'x' is not "
        r"(an integer|a number)( \(allowed: [^\n]+\))?\n",
        err,
    ), err


@pytest.mark.parametrize("argv, flag", CHOICES, ids=[" ".join([*a, f]) for a, f in CHOICES])
def test_a_choice_flag_refuses_in_the_project_line(argv, flag, capsys, worded):
    """``arg_types.one_of``: the value and the choices as a refusal record, not argparse's ``invalid choice``."""
    with pytest.raises(SystemExit) as e:
        main([*argv, flag, "x"])
    assert e.value.code == 2
    assert_cli_refusal(capsys.readouterr().err, f"attnserve {' '.join(argv)}", Refuses(f"argument {flag}", "x"), worded)
    assert worded[-1].allowed and "x" not in worded[-1].allowed.split(", ")


def test_choice_flags_are_covered():
    assert {"--log-level", "--endpoint", "--dataset", "--baseline", "--format"} <= {f for _, f in CHOICES}


@pytest.mark.parametrize(
    "argv, line",
    [
        # engine flags (every command that builds an engine): the field's allowed values
        (
            ["generate", "--seed", "abc"],
            Refuses("argument --seed", "abc", "integer in [-2^63, 2^63 - 1]"),
        ),
        # every seed's range (was [0, 2**64 - 1] here while a request's seed took negatives)
        (
            ["generate", "--seed", "9223372036854775808"],
            Refuses("argument --seed", 9223372036854775808, "integer in [-2^63, 2^63 - 1]"),
        ),
        (
            ["generate", "--max-model-len", "1.5"],  # a size flag of vLLM's (human_readable_int): its suffixes too
            Refuses(
                "argument --max-model-len",
                "1.5",
                "integer >= 1, null; suffixes as in vLLM: k, m, g, t = 10^3, 10^6, 10^9, 10^12 (with a fraction: 1.5k); K, M, G, T = 2^10, 2^20, 2^30, 2^40 (whole numbers only)",
            ),
        ),
        (
            ["generate", "--gpu-memory-utilization", "x"],
            Refuses("argument --gpu-memory-utilization", "x", "number in (0, 1]"),
        ),
        (
            ["serve", "--seed", "abc"],
            Refuses("argument --seed", "abc", "integer in [-2^63, 2^63 - 1]"),
        ),
        (
            ["bench", "attention", "--block-size", "7"],  # the engine's sizes (was accepted)
            Refuses("argument --block-size", 7, "1, 2, 4, 8, 16, 32, 64, 128, 256"),
        ),
        (
            ["serve", "--block-size", "1e3"],
            Refuses("argument --block-size", "1e3", "1, 2, 4, 8, 16, 32, 64, 128, 256"),
        ),
        (
            ["bench", "throughput", "--seed", "abc"],
            Refuses("argument --seed", "abc", "integer in [-2^63, 2^63 - 1]"),
        ),
        # generate's sampling flags: SamplingParams' ranges (was "invalid int value: '1.5'", "invalid float value: 'x'")
        (
            ["generate", "--max-tokens", "1.5"],
            Refuses("argument --max-tokens", "1.5", "integer >= 1"),
        ),
        (
            ["generate", "--temperature", "x"],
            Refuses("argument --temperature", "x", "finite number >= 0"),
        ),
        (
            ["generate", "--top-p", "x"],
            Refuses("argument --top-p", "x", "number in (0, 1]"),
        ),
        (
            ["generate", "--n", "two"],
            Refuses("argument --n", "two", "integer >= 1"),
        ),
        (
            ["generate", "--logprobs", "1.0"],
            Refuses("argument --logprobs", "1.0", "integer >= 0"),
        ),
        # serve's and the benchmarks' own flags
        (
            ["serve", "--port", "http"],
            Refuses("argument --port", "http", "integer in [0, 65535]; 0 picks a free port"),
        ),
        (
            ["serve", "--shutdown-timeout", "10s"],
            Refuses("argument --shutdown-timeout", "10s", "finite number >= 0 (seconds)"),
        ),
        (
            ["bench", "serve", "--seed", "abc"],
            Refuses("argument --seed", "abc", "integer in [-2^63, 2^63 - 1]"),
        ),
        (
            ["bench", "serve", "--seed", str(2**63)],  # the engine's --seed range; negatives are taken, as there
            Refuses("argument --seed", 2**63, "integer in [-2^63, 2^63 - 1]"),
        ),
        (
            ["bench", "serve", "--temperature", "x"],
            Refuses("argument --temperature", "x", "finite number >= 0"),
        ),
        (
            ["bench", "serve", "--temperature", "-1"],  # was accepted, and every request then failed with a 400
            Refuses("argument --temperature", -1.0, "finite number >= 0"),
        ),
        (
            ["bench", "serve", "--num-prompts", "1.5"],
            Refuses("argument --num-prompts", "1.5", "integer >= 1"),
        ),
        (
            ["bench", "latency", "--batch-size", "1", "x"],
            Refuses("argument --batch-size", "x", "integer >= 1"),
        ),
        (
            ["bench", "attention", "--repeats", "2.5"],
            Refuses("argument --repeats", "2.5", "integer >= 1"),
        ),
    ],
)
def test_exact_lines(argv, line, capsys, worded):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    prog = " ".join(["attnserve", *argv[: 2 if argv[0] == "bench" else 1]])
    assert_cli_refusal(capsys.readouterr().err, prog, line, worded)


def test_the_installed_command_prints_the_line_and_exits_2():
    """The same through ``python -m attnserve``: one line on stderr, no traceback."""
    import subprocess
    import sys

    from tests.helpers import ROOT

    proc = subprocess.run(
        [sys.executable, "-m", "attnserve", "bench", "serve", "--seed", "abc"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        2,
        "",
        "attnserve bench serve: error: argument --seed: 'abc' is not an integer (allowed: integer in [-2^63, 2^63 - 1])\n",
    )
