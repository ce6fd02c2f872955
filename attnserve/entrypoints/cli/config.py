"""``attnserve config [engine flags]``: print the effective EngineConfig as JSON; loads no model.

``--explain`` prints, instead, one line per value with where it came from (default, which file,
which flag).

A ``max_model_len`` that is set is checked against the model's ``max_position_embeddings``, as ``generate`` and
``serve`` check it, when the model's config is on this machine: the default model's when no model is given, a
local folder's or .gguf file's. A hub id is not downloaded for it: the line on stderr says the value was not
checked. Nothing else is judged against the model or this machine (``attnserve backends`` does that), so that a
config can be planned for another machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from attnserve.config import EngineConfig
from attnserve.entrypoints.cli.engine_args import add_engine_args, error_line, resolve_engine_args


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "config",
        help="print the effective engine configuration (no model is loaded)",
        description="Print the EngineConfig that these flags and files give, as JSON. Loads no model; a "
                    "--max-model-len is checked against the model's config when that is on this machine (the default "
                    "model's when none is given), as generate checks it.",
    )
    add_engine_args(p, positional_model=True)
    p.add_argument("--explain", action="store_true", help="show where each value came from instead of the JSON")
    p.set_defaults(func=run)


def check_max_model_len(config: EngineConfig) -> str | None:
    """Raise the engine's ConfigError (keyed ``max_model_len``) for a max_model_len beyond the model's
    ``max_position_embeddings`` when the model's config is local (the default model, a folder, a .gguf file); return
    why it was not checked otherwise (a hub id: not downloaded here; a model that cannot be read), or None."""
    from attnserve.model_executor.loader import complete_hf_config, max_model_len_of, read_hf_config, resolve_model

    model = config.model.model
    if config.model.max_model_len is None:
        return None
    if model is not None and not os.path.exists(os.path.expanduser(model)):
        return f"model {model!r} is not a local folder or file, and config downloads nothing"
    try:
        source = resolve_model(config.model)
        hf_config = read_hf_config(source)
        complete_hf_config(hf_config, source)  # a GPT-2 GGUF's context length is known only from its tensors
    except (OSError, ValueError) as e:  # no config.json, an unreadable file: generate reports it when it loads
        return f"the model's config cannot be read ({' '.join(str(e).split())})"
    max_model_len_of(config.model, hf_config)
    return None


def run(args: argparse.Namespace) -> int:
    resolved = resolve_engine_args(args)
    try:
        unchecked = check_max_model_len(resolved.config)
    except ValueError as e:  # the engine's ConfigError: one line naming the flag or file, exit 2 (as generate)
        args._engine_arg_parser.error(error_line(args, getattr(e, "key", None), str(e)))
    if unchecked:
        print(f"attnserve config: note: max_model_len {resolved.config.model.max_model_len} not checked against the "
              f"model: {unchecked}", file=sys.stderr)
    if not args.explain:
        print(json.dumps(resolved.config.to_dict(), indent=2))
        return 0
    rows = [(path, json.dumps(value), source) for path, value, source in resolved.explain()]
    w_path = max(len(r[0]) for r in rows)
    w_value = max(len(r[1]) for r in rows)
    for path, value, source in rows:
        print(f"{path:<{w_path}}  {value:<{w_value}}  {source}")
    return 0
