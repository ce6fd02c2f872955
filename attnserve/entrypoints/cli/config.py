"""``attnserve config [engine flags]``: print the effective configuration as a config file; loads no model.

It prints the flat form that ``--config`` takes, as JSON (``--format yaml``: YAML, the format of vLLM's --config
files): one key per engine argument, ``attention_backend`` and ``attention_config``
(:func:`attnserve.config.engine_args.engine_arg_values`), so that ``attnserve config ... > cfg.json`` and ``attnserve
serve --config cfg.json`` run with that configuration (vLLM's ``--config`` takes a flat file of option names too).

``--explain`` prints, instead, one line per value with where it came from (default, which file,
which flag); a table, so ``--format`` with it is refused.

A ``max_model_len`` that is set is checked against the model's ``max_position_embeddings``, as ``generate`` and
``serve`` check it, when the model's config is on this machine: the default model's when no model is given, a
local folder's or .gguf file's. A KV cache that ``--num-gpu-blocks`` or ``--kv-cache-memory`` sizes is checked, as
``serve`` checks it, against that model too: it must hold one request of max_model_len tokens (and its budget at
least one block). A hub id is not downloaded for these checks: a line on stderr says what was not checked. Nothing
else is judged against the model or this machine (``attnserve backends`` does that; nor is the KV cache judged
against this machine's free memory), so that a config can be planned for another machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from attnserve.config import EngineConfig
from attnserve.config.engine_args import engine_arg_values
from attnserve.entrypoints.cli.arg_types import one_of
from attnserve.entrypoints.cli.engine_args import add_engine_args, error_line, resolve_engine_args
from attnserve.refusals import message
from attnserve.refusals.cli import format_with_explain


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "config",
        help="print the effective engine configuration (no model is loaded)",
        description="Print the configuration that these flags and files give, as a config file (JSON, or YAML with "
        "--format yaml) that --config takes back (engine argument names, as the flags). Loads no model; a "
        "--max-model-len is checked against the model's config when that is on this machine (the default "
        "model's when none is given), as generate checks it.",
    )
    add_engine_args(p, positional_model=True)
    p.add_argument(
        "--format",
        **one_of(["json", "yaml"]),
        default=None,
        help="the printed config file's format (default json); --config reads both. Not with --explain",
    )
    p.add_argument("--explain", action="store_true", help="show where each value came from instead of the config file")
    p.set_defaults(func=run)


def local_hf_config(config: EngineConfig) -> tuple[object | None, str | None]:
    """The model's HF config, completed as the engine completes it, when it is on this machine (the default model, a
    folder, a .gguf file): ``(hf_config, None)``; else ``(None, why)`` (a hub id: not downloaded here; a model that
    cannot be read)."""
    from attnserve.model_executor.loader import complete_hf_config, read_hf_config, resolve_model

    model = config.model.model
    if model is not None and not os.path.exists(os.path.expanduser(model)):
        return None, f"model {model!r} is not a local folder or file, and config downloads nothing"
    try:
        source = resolve_model(config.model)
        hf_config = read_hf_config(source)
        complete_hf_config(hf_config, source)  # a GPT-2 GGUF's context length is known only from its tensors
    except (OSError, ValueError) as e:  # no config.json, an unreadable file: generate reports it when it loads
        return None, f"the model's config cannot be read ({' '.join(str(e).split())})"
    return hf_config, None


def _device_type(device: str) -> str:
    """ "cpu" or "cuda" for a device setting; ``auto``: this machine's, as the engine would run here."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cpu" if device == "cpu" else "cuda"


def check_kv_cache(config: EngineConfig, hf_config) -> str | None:
    """Raise ``serve``'s ConfigError (keyed to the KV-cache setting, for the flag to be named) when a KV cache sized
    by ``num_gpu_blocks`` or ``kv_cache_memory`` holds fewer tokens than max_model_len (the model's
    ``max_position_embeddings`` when unset), or when the ``kv_cache_memory`` budget holds no block of the model's.
    Not judged: this machine's free memory, and a cache that ``gpu_memory_utilization`` or the CPU's default
    sizes (no flag gives its size). Returns why it was not checked (the model's block size cannot be told: an
    architecture not supported, heads the ranks cannot split), else None."""
    from attnserve.model_executor.kv_cache import (
        check_kv_cache_holds_max_model_len,
        kv_cache_size_key,
        planned_kv_blocks,
    )
    from attnserve.model_executor.loader import max_model_len_of, resolve_dtype
    from attnserve.model_executor.preflight import kv_block_bytes

    import torch

    cache = config.cache
    if cache.num_gpu_blocks is None and cache.kv_cache_memory is None:
        return None
    device_type = _device_type(config.device)
    try:  # the model's architecture and head split are judged by generate and serve, not here
        block_bytes = kv_block_bytes(config, hf_config, resolve_dtype(config.model.dtype, hf_config, device_type))
    except ValueError as e:
        return " ".join(str(e).split())
    blocks = planned_kv_blocks(cache, device_type, block_bytes)
    assert blocks is not None  # a size is set
    check_kv_cache_holds_max_model_len(
        max_model_len_of(config.model, hf_config),
        blocks,
        cache.block_size,
        kv_cache_size_key(cache, torch.device(device_type)),
    )
    return None


def check_against_model(config: EngineConfig) -> list[str]:
    """Judge the settings that the model bounds, as ``generate`` and ``serve`` judge them, when the model's config is
    on this machine: a max_model_len beyond its ``max_position_embeddings`` (``max_model_len_of``), a KV cache sized
    by a flag that cannot hold one request of max_model_len tokens (:func:`check_kv_cache`). Raises their
    ConfigError; returns the notes for what could not be checked (no model config is read when nothing is set)."""
    from attnserve.model_executor.loader import max_model_len_of

    max_model_len, cache = config.model.max_model_len, config.cache
    if max_model_len is None and cache.num_gpu_blocks is None and cache.kv_cache_memory is None:
        return []
    hf_config, why = local_hf_config(config)
    notes = []
    if max_model_len is not None:
        if hf_config is None:
            notes.append(f"max_model_len {max_model_len} not checked against the model: {why}")
        else:
            max_model_len_of(config.model, hf_config)
    if cache.num_gpu_blocks is not None or cache.kv_cache_memory is not None:
        unchecked = why if hf_config is None else check_kv_cache(config, hf_config)
        what = (
            f"num_gpu_blocks {cache.num_gpu_blocks}"
            if cache.num_gpu_blocks is not None
            else f"kv_cache_memory {cache.kv_cache_memory}"
        )
        if unchecked:
            notes.append(f"KV cache ({what}) not checked against max_model_len: {unchecked}")
    return notes


def kv_cache_row(config: EngineConfig) -> tuple[str, str, str]:
    """``--explain``'s derived row for the KV cache: its element type and where an fp8 cache's scales come from
    (the model's safetensors headers are read when it is a local folder; nothing else is loaded)."""
    from attnserve.model_executor.kv_scales import kv_cache_summary

    cache, model = config.cache, config.model.model
    folder = os.path.expanduser(model) if model is not None and os.path.isdir(os.path.expanduser(model)) else None
    kv = kv_cache_summary(
        cache.kv_cache_dtype,
        f"{config.model.dtype} (the model dtype)" if config.model.dtype == "auto" else config.model.dtype,
        cache.calculate_kv_scales,
        folder,
    )
    return "(kv cache)", json.dumps(kv["dtype"]), f"derived: fp8 scales {kv['scales']}"


def skinny_gemm_row(config: EngineConfig) -> tuple[str, str, str]:
    """``--explain``'s derived row for ``use_skinny_gemm``: on or off for this device setting (``auto``: this
    machine's), CUDA graphs (off with enforce_eager; a backend without graphs turns it off at load too) and
    this machine's Triton, and why."""
    from attnserve.gemv.enable import resolve_skinny_gemm, triton_installed

    skinny = resolve_skinny_gemm(
        config.use_skinny_gemm, _device_type(config.device), not config.enforce_eager, triton_installed()
    )
    return "(skinny gemm)", json.dumps(skinny.on), f"derived: {skinny.explained()}"


def config_file_text(values: dict, fmt: str) -> str:
    """``values`` as a config file of format ``fmt`` (``json``, ``yaml``: keys in their order), ending in a newline."""
    if fmt == "yaml":
        import yaml

        return yaml.safe_dump(values, sort_keys=False)
    return json.dumps(values, indent=2) + "\n"


def run(args: argparse.Namespace) -> int:
    if args.explain and args.format is not None:  # the table has no format: refused rather than ignored
        args._engine_arg_parser.error(message(format_with_explain(args.format)))
    resolved = resolve_engine_args(args)
    try:
        notes = check_against_model(resolved.config)
    except ValueError as e:  # the engine's ConfigError: one line naming the flag or file, exit 2 (as serve)
        args._engine_arg_parser.error(error_line(args, e))
    for note in notes:
        print(f"attnserve config: note: {note}", file=sys.stderr)
    if not args.explain:
        print(config_file_text(engine_arg_values(resolved.config), args.format or "json"), end="")
        return 0
    rows = [(path, json.dumps(value), source) for path, value, source in resolved.explain()]
    rows.append(kv_cache_row(resolved.config))
    rows.append(skinny_gemm_row(resolved.config))
    w_path = max(len(r[0]) for r in rows)
    w_value = max(len(r[1]) for r in rows)
    for path, value, source in rows:
        print(f"{path:<{w_path}}  {value:<{w_value}}  {source}")
    return 0
