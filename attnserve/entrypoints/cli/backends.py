"""``attnserve backends``: which attention backends can run a model here (or on a named platform), and why.

    attnserve backends [MODEL] [engine flags] [--head-size N --num-heads H --num-kv-heads K]
                       [--sliding-window W] [--assume-installed] [--json]

Engine settings come from the argument layer that ``generate``, ``serve`` and ``config`` share
(``--model``, ``--dtype``, ``--block-size``, ``--kv-cache-dtype``, ``--device``, ``--attention-backend``,
``-ac.FIELD``, ``-ac JSON``, ``--config FILE``, ...); ``--device`` also takes a simulated GPU such as
``cuda:9.0`` (compute capability 9.0) to plan for another machine. Only the planning flags are this
command's own.

Prints every backend with ✓ or its reasons, the platform's priority order and the backend automatic
selection picks. Exit status: 0; 2 with one line on stderr for a bad flag value or a setting the model bounds
(``--max-model-len``, a KV cache too small for one request, ``--tensor-parallel-size``), and as in ``generate``
for an explicit backend (``--attention-backend X`` or ``attention_config.backend``) that cannot run the
model (the table, or with ``--json`` the report, still goes to stdout first).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from attnserve.entrypoints.cli.arg_types import positive_int
from attnserve.entrypoints.cli.engine_args import (
    EngineArgumentParser,
    add_engine_args,
    engine_config_from_args,
    error_line,
)
from attnserve.entrypoints.cli.model_facts import ModelAttentionFacts, read_model_facts


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register the ``backends`` subcommand on ``subparsers``."""
    p = subparsers.add_parser(
        "backends", help="show which attention backends can run a model, and why", description=__doc__.split("\n\n")[0]
    )
    add_arguments(p)
    p.set_defaults(func=run_backends)
    return p


def add_arguments(p: EngineArgumentParser) -> None:
    """The shared engine flags (model, dtype, block size, device, attention, config files) and the
    planning flags of ``backends``."""
    add_engine_args(p, positional_model=True)
    plan = p.add_argument_group("planning", "Describe the model by hand, or judge packages not installed here.")
    plan.add_argument("--head-size", type=positive_int, default=None, help="attention head size (instead of a model)")
    plan.add_argument("--num-heads", type=positive_int, default=None, help="query heads (with --head-size)")
    plan.add_argument("--num-kv-heads", type=positive_int, default=None, help="key/value heads (with --head-size)")
    plan.add_argument(
        "--sliding-window", type=positive_int, default=None, help="sliding window in tokens (default: the model's)"
    )
    plan.add_argument(
        "--assume-installed",
        action="store_true",
        help="judge backends as if their packages were installed (planning for another machine)",
    )
    plan.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def _model_facts(args, model: str | None) -> ModelAttentionFacts:
    if args.head_size is not None:
        base = read_model_facts(model) if model else None
        heads = args.num_heads or (base.num_heads if base else None)
        return ModelAttentionFacts(
            source=base.source if base else "--head-size",
            head_size=args.head_size,
            num_heads=heads,
            num_kv_heads=args.num_kv_heads or (base.num_kv_heads if base else heads),
            sliding_window=base.sliding_window if base else None,
            logits_soft_cap=base.logits_soft_cap if base else None,
            layers=base.layers if base else (),
            hf_config=base.hf_config if base else None,
        )
    facts = read_model_facts(model)
    overrides = {k: v for k, v in (("num_heads", args.num_heads), ("num_kv_heads", args.num_kv_heads)) if v}
    return dataclasses.replace(facts, **overrides)


def _check_against_model(config, facts: ModelAttentionFacts) -> None:
    """The settings the model bounds, judged as ``generate`` and ``config`` judge them (a max_model_len beyond the
    model's, a KV cache sized by a flag too small for one request, a tensor-parallel size its heads do not split):
    a backend table for settings that cannot run would answer the wrong question. Raises their ConfigError."""
    from attnserve.distributed.sharding import check_tensor_parallel_size
    from attnserve.entrypoints.cli.config import check_against_model

    check_against_model(config)
    if facts.hf_config is not None and config.parallel.tensor_parallel_size > 1:
        check_tensor_parallel_size(facts.hf_config, config.parallel.tensor_parallel_size)


def _layer_groups(args, facts: ModelAttentionFacts) -> list[tuple[tuple[int, ...] | None, object]]:
    """``(layers, LayerAttention)`` of each layer group the engine would form (``attention_selection``'s rule);
    ``--head-size`` and ``--sliding-window`` replace every group's. One group of unknown layers (None) when only
    flags describe the model."""
    from attnserve.model_executor.attention_selection import layer_groups
    from attnserve.models.dims import LayerAttention

    kinds = facts.layers or (LayerAttention(facts.head_size, facts.sliding_window, facts.logits_soft_cap),)
    changes = {}
    if args.head_size is not None:
        changes["head_size"] = args.head_size
    if args.sliding_window is not None:
        changes["sliding_window"] = args.sliding_window
    kinds = tuple(dataclasses.replace(k, **changes) for k in kinds)
    return [(layers if facts.layers else None, kind) for kind, layers in layer_groups(kinds)]


def _flashinfer_kernels(config, facts: ModelAttentionFacts, kind, dtype) -> dict | None:
    """Whether FlashInfer's JIT modules for this layer group are compiled on this machine (a file check, no
    compile: ``flashinfer_jit.compiled_status``), or None where that cannot be told (heads unknown, FlashInfer
    another version)."""
    from attnserve.attention.backends.flashinfer_jit import compiled_status
    from attnserve.model_executor.compile_ahead import layer_spec_of
    from attnserve.platforms import runtime_device

    if not facts.num_heads or not facts.num_kv_heads:
        return None
    spec = layer_spec_of(kind, facts.num_heads, facts.num_kv_heads, config.cache.kv_cache_dtype)
    return compiled_status([spec], runtime_device(config.device), dtype, config.attention)


def build_report(args, errors: list | None = None) -> dict:
    """Everything the table and ``--json`` show. Raises ValueError for bad flag values (a bad engine
    flag exits 2 through the parser, as in every command). ``errors`` gets the selection's refusal, if any.

    A model whose layers differ (Gemma 2: windowed and global layers) has several layer groups: ``groups`` holds
    each one's selector config, backend table and selection; the top-level ``selector_config``, ``backends``,
    ``flash_attn_version``, ``kv_cache_layout`` and ``error`` are the first group's (the first failing one's
    error), and ``selected`` is each group's backend joined by ``+`` (None when some group has none).
    ``unused_options``: the attention_config options given that a group's selected backend ignores (the engine warns
    about them once at start-up); the top level's, those of any group."""
    from attnserve.attention.registry import backend_name, lookup_backend, registered_names
    from attnserve.attention.selector import (
        AttentionSelectorConfig,
        NoUsableBackendError,
        backend_reasons,
        select_attn_backend,
    )
    from attnserve.model_executor.attention_selection import for_group, layer_group_name
    from attnserve.model_executor.kv_scales import kv_cache_summary
    from attnserve.model_executor.loader import resolve_dtype
    from attnserve.platforms import detect_platform

    config = engine_config_from_args(args)
    platform = detect_platform(config.device)
    facts = _model_facts(args, config.model.model)
    _check_against_model(config, facts)
    attention_config = config.attention
    explicit = attention_config.backend
    priority = [m.name for m in platform.backend_priorities()]
    names = priority + [n for n in registered_names() if n not in priority]
    # the engine's own rule for the platform judged: auto = float32 on CPU, the checkpoint's on GPU
    dtype = resolve_dtype(config.model.dtype, facts.hf_config, platform.device_type)
    groups = []
    for index, (layers, kind) in enumerate(_layer_groups(args, facts)):
        cfg = AttentionSelectorConfig(
            head_size=kind.head_size,
            dtype=dtype,
            kv_cache_dtype=config.cache.kv_cache_dtype,
            block_size=config.cache.block_size,
            sliding_window=kind.sliding_window,
            logits_soft_cap=kind.logits_soft_cap,
            has_sink=kind.has_sink,
        )
        table = {}
        for name in names:
            reasons = backend_reasons(lookup_backend(name), cfg, platform, attention_config, args.assume_installed)[1]
            table[name] = {"usable": not reasons, "reasons": reasons, "in_priority": name in priority}
        group = {
            "name": layer_group_name(index, layers, kind) if layers else "all layers",
            "layers": list(layers) if layers else None,
            "selector_config": cfg.to_dict(),
            "backends": table,
            "selected": None,
            "flash_attn_version": None,
            "kv_cache_layout": None,
            "unused_options": [],
            "error": None,
        }
        try:
            sel = select_attn_backend(explicit, cfg, platform, attention_config, assume_installed=args.assume_installed)
            group.update(
                selected=sel.name,
                flash_attn_version=sel.flash_attn_version,
                kv_cache_layout=sel.kv_cache_layout.value,
                unused_options=attention_config.unused_options(sel.name),  # what the engine warns about at start-up
            )
            if sel.name == "FLASHINFER" and not platform.simulated and not args.assume_installed:
                group["flashinfer_kernels"] = _flashinfer_kernels(config, facts, kind, dtype)
        except NoUsableBackendError as e:
            if layers is not None and len(layers) < len(facts.layers):
                e = for_group(e, group["name"])
            group["error"] = str(e)
            if errors is not None:
                errors.append(e)
        groups.append(group)
    first = groups[0]
    failed = [g for g in groups if g["selected"] is None]
    return {
        "platform": platform.to_dict(),
        "device": config.device,
        "model": {"source": facts.source, "num_heads": facts.num_heads, "num_kv_heads": facts.num_kv_heads},
        "selector_config": first["selector_config"],
        "attention_config": attention_config.to_dict(),
        "assume_installed": args.assume_installed,
        "priority": priority,
        "backends": first["backends"],
        "explicit": backend_name(explicit) if explicit else None,
        "selected": None if failed else "+".join(dict.fromkeys(g["selected"] for g in groups)),
        "flash_attn_version": first["flash_attn_version"],
        "kv_cache_layout": first["kv_cache_layout"],
        # the cache's element type and where an fp8 cache's scales come from (never silently 16-bit)
        "kv_cache": kv_cache_summary(
            config.cache.kv_cache_dtype, dtype, config.cache.calculate_kv_scales, facts.source
        ),
        "unused_options": list(dict.fromkeys(n for g in groups for n in g["unused_options"])),
        "error": failed[0]["error"] if failed else None,
        "groups": groups,
    }


def render_plain(report: dict) -> str:
    """A plain-text table (used when stdout is not a terminal or rich is missing); one per layer group when the
    model has several."""
    plat = report["platform"]
    lines = [
        f"Platform: {plat['description']}" + ("  [packages assumed installed]" if report["assume_installed"] else ""),
        f"Model: {report['model']['source']}  (heads {report['model']['num_heads']}, "
        f"kv heads {report['model']['num_kv_heads']})",
        _kv_cache_line(report),
    ]
    several = len(report["groups"]) > 1
    for group in report["groups"]:
        if several:
            lines += ["", f"{group['name'][0].upper()}{group['name'][1:]}: {group['selected'] or 'no backend'}"]
        lines += ["Selector config: " + ", ".join(f"{k}={v}" for k, v in group["selector_config"].items()), ""]
        width = max(len(n) for n in group["backends"]) + 2
        lines.append(f"{'backend':<{width}}{'prio':<6}status")
        for name, entry in group["backends"].items():
            prio = str(report["priority"].index(name) + 1) if entry["in_priority"] else "-"
            status = "✓" if entry["usable"] else "✗ " + "; ".join(entry["reasons"])
            lines.append(f"{name:<{width}}{prio:<6}{status}")
        if group.get("flashinfer_kernels"):
            lines.append(_kernels_line(group["flashinfer_kernels"]))
        if group["unused_options"]:
            lines.append(_unused_line(group))
    lines += ["", "Priority order: " + " > ".join(report["priority"]), _verdict(report)]
    return "\n".join(lines)


def _kernels_line(kernels: dict) -> str:
    """E.g. ``FlashInfer kernels: 2 of 2 compiled`` or ``... 0 of 2 compiled (the engine compiles the rest at its
    first step ...: names)``: when, as ``kernels["ahead"]`` says (``flashinfer_jit.compile_ahead_on``)."""
    from attnserve.attention.backends.flashinfer_jit import ON_ENV

    done, missing = len(kernels["compiled"]), len(kernels["missing"])
    line = f"FlashInfer kernels for this config: {done} of {done + missing} compiled"
    if missing:
        when = (
            "in the background at its first start"
            if kernels.get("ahead")
            else f"at its first step (FlashInfer's lazy compile; {ON_ENV}=1: in the background)"
        )
        line += f" (the engine compiles the rest {when}: " + ", ".join(kernels["missing"]) + ")"
    return line


def _unused_line(group: dict) -> str:
    """E.g. ``Unused options: flash_attn_version (they do not apply to FLASHINFER)``: the engine's start-up note."""
    return f"Unused options: {', '.join(group['unused_options'])} (they do not apply to {group['selected']})"


def _kv_cache_line(report: dict) -> str:
    kv = report["kv_cache"]
    return f"KV cache: {kv['dtype']} (kv_cache_dtype {kv['kv_cache_dtype']}), fp8 scales {kv['scales']}"


def _verdict(report: dict) -> str:
    if report["explicit"]:
        ok = report["selected"] is not None
        return f"Explicit choice: {report['explicit']} " + ("✓ can run" if ok else "✗ cannot run")
    return f"Automatic selection: {report['selected'] or 'none (no backend can run this model here)'}"


def render_rich(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    plat = report["platform"]
    console.print(
        f"[bold]Platform:[/bold] {plat['description']}"
        + ("  [dim](packages assumed installed)[/dim]" if report["assume_installed"] else "")
    )
    console.print(f"[bold]{_kv_cache_line(report)}[/bold]")
    for group in report["groups"]:
        if len(report["groups"]) > 1:
            console.print(f"[bold]{group['name']}:[/bold] {group['selected'] or 'no backend'}")
        console.print(
            f"[bold]Model:[/bold] {report['model']['source']}  "
            + ", ".join(f"{k}={v}" for k, v in group["selector_config"].items())
        )
        table = Table(show_lines=False)
        for col in ("backend", "priority", "status"):
            table.add_column(col)
        for name, entry in group["backends"].items():
            prio = str(report["priority"].index(name) + 1) if entry["in_priority"] else "-"
            status = "[green]✓[/green]" if entry["usable"] else "[red]✗[/red] " + "\n".join(entry["reasons"])
            table.add_row(name, prio, status)
        console.print(table)
        if group.get("flashinfer_kernels"):
            console.print(_kernels_line(group["flashinfer_kernels"]))
        if group["unused_options"]:
            console.print(_unused_line(group))
    console.print("Priority order: " + " > ".join(report["priority"]))
    console.print(f"[bold]{_verdict(report)}[/bold]")


def run_backends(args) -> int:
    """The subcommand body: 0, or 2 for a bad flag value or an explicit backend that cannot run."""
    errors: list = []
    try:
        report = build_report(args, errors)
    except ValueError as e:  # a flag value, or a setting the model bounds: one line naming the flag
        print(f"attnserve backends: error: {error_line(args, e)}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        try:
            use_rich = sys.stdout.isatty()
            if use_rich:
                render_rich(report)
        except ImportError:
            use_rich = False
        if not use_rich:
            print(render_plain(report))
    if report["explicit"] and report["selected"] is None:
        print(f"attnserve backends: error: {error_line(args, errors[0])}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run ``attnserve backends`` alone (tests, ``python -m attnserve.entrypoints.cli.backends``).

    Returns the exit status (2 for a flag the parser rejects, with its one-line error on stderr).
    """
    parser = EngineArgumentParser(prog="attnserve backends")
    add_arguments(parser)
    try:
        return run_backends(parser.parse_args(argv))
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
