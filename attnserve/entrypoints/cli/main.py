"""The ``attnserve`` command: one subcommand per module, imported only when it runs."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys

# subcommand -> module exposing add_parser(subparsers) (which sets ``func`` on its parser)
COMMANDS = {
    "generate": "attnserve.entrypoints.cli.generate",
    "serve": "attnserve.entrypoints.cli.serve",
    "bench": "attnserve.entrypoints.cli.bench",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnserve", description="LLM inference with pluggable attention backends")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for module in COMMANDS.values():
        if importlib.util.find_spec(module) is None:  # a subcommand not in this checkout (yet)
            continue
        importlib.import_module(module).add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
