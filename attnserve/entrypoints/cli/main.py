"""The ``attnserve`` command: one subcommand per module, imported only when it runs."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

import attnserve
from attnserve.entrypoints.cli.engine_args import EngineArgumentParser

# subcommand -> (module exposing add_parser(subparsers), which sets ``func`` on its parser; one-line help)
COMMANDS = {
    "generate": ("attnserve.entrypoints.cli.generate", "generate text for prompts (default model and prompt if none)"),
    "serve": ("attnserve.entrypoints.cli.serve", "start the OpenAI-compatible HTTP server"),
    "bench": (
        "attnserve.entrypoints.cli.bench",
        "benchmarks: throughput, latency, attention kernels, a running server",
    ),
    "backends": ("attnserve.entrypoints.cli.backends", "which attention backends can run a model here, and why not"),
    "config": ("attnserve.entrypoints.cli.config", "print the effective engine configuration (--explain: where from)"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The attnserve parser; only ``command``'s module is imported (the others are listed by name)."""
    parser = EngineArgumentParser(prog="attnserve", description="LLM inference with pluggable attention backends")
    parser.add_argument(
        "--version",
        action="version",
        version=f"attnserve {attnserve.__version__}",
        help="print the attnserve version and exit",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=EngineArgumentParser)
    sub.required = True
    for name, (module, help_text) in COMMANDS.items():
        if name == command:
            importlib.import_module(module).add_parser(sub)
        else:
            sub.add_parser(name, help=help_text)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:  # `attnserve` alone: the commands and what each does, not only "required: COMMAND"
        build_parser().print_help(sys.stderr)
        return 2
    command = argv[0] if argv and argv[0] in COMMANDS else None
    args = build_parser(command).parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # `attnserve backends | head`: the reader left; no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's documented EPIPE recipe
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
