"""``attnserve config [engine flags]``: print the effective EngineConfig as JSON; loads no model.

``--explain`` prints, instead, one line per value with where it came from (default, which file,
which flag).
"""

from __future__ import annotations

import argparse
import json

from attnserve.entrypoints.cli.engine_args import add_engine_args, resolve_engine_args


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "config",
        help="print the effective engine configuration (no model is loaded)",
        description="Print the EngineConfig that these flags and files give, as JSON. Loads no model.",
    )
    add_engine_args(p, positional_model=True)
    p.add_argument("--explain", action="store_true", help="show where each value came from instead of the JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    resolved = resolve_engine_args(args)
    if not args.explain:
        print(json.dumps(resolved.config.to_dict(), indent=2))
        return 0
    rows = [(path, json.dumps(value), source) for path, value, source in resolved.explain()]
    w_path = max(len(r[0]) for r in rows)
    w_value = max(len(r[1]) for r in rows)
    for path, value, source in rows:
        print(f"{path:<{w_path}}  {value:<{w_value}}  {source}")
    return 0
