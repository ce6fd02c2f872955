"""``attnserve backends``: which attention backends can run a model here (or on a named platform), and why.

    attnserve backends [--model M | --head-size N --num-heads H --num-kv-heads K] [--dtype D]
                       [--block-size N] [--kv-cache-dtype K] [--sliding-window W] [--device cuda:9.0|cpu]
                       [--attention-backend X] [--flash-attn-version V] [--assume-installed] [--json]

Prints every backend with ✓ or its reasons, the platform's priority order and the backend automatic
selection picks. Exit status: 0; with ``--attention-backend X``, 1 when X cannot run (its reasons are
printed); 2 for a bad flag value.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from attnserve.entrypoints.cli.model_facts import ModelAttentionFacts, parse_dtype, read_model_facts

KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register the ``backends`` subcommand on ``subparsers``."""
    p = subparsers.add_parser("backends", help="show which attention backends can run a model, and why",
                              description=__doc__.split("\n\n")[0])
    add_arguments(p)
    p.set_defaults(func=run_backends)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="model folder (only its config is read); default: the default model")
    p.add_argument("--head-size", type=int, default=None, help="attention head size (instead of --model)")
    p.add_argument("--num-heads", type=int, default=None, help="query heads (with --head-size)")
    p.add_argument("--num-kv-heads", type=int, default=None, help="key/value heads (with --head-size)")
    p.add_argument("--dtype", default="auto", help="model dtype: auto (the checkpoint's), float16, bfloat16, float32")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV-cache block (default 16)")
    p.add_argument("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPES, help="KV-cache dtype")
    p.add_argument("--sliding-window", type=int, default=None, help="sliding window in tokens (default: the model's)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N, or a simulated GPU such as cuda:9.0")
    p.add_argument("--attention-backend", default=None, help="judge this backend (exit 1 when it cannot run)")
    p.add_argument("--flash-attn-version", type=int, default=None, choices=(2, 3, 4), help="FLASH_ATTN version")
    p.add_argument("--assume-installed", action="store_true",
                   help="judge backends as if their packages were installed (planning for another machine)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def _model_facts(args) -> ModelAttentionFacts:
    if args.head_size is not None:
        base = read_model_facts(args.model) if args.model else None
        heads = args.num_heads or (base.num_heads if base else None)
        return ModelAttentionFacts(
            source=base.source if base else "--head-size", head_size=args.head_size, num_heads=heads,
            num_kv_heads=args.num_kv_heads or (base.num_kv_heads if base else heads),
            dtype=base.dtype if base else parse_dtype("bfloat16"),
            sliding_window=base.sliding_window if base else None,
            logits_soft_cap=base.logits_soft_cap if base else None)
    facts = read_model_facts(args.model)
    overrides = {k: v for k, v in (("num_heads", args.num_heads), ("num_kv_heads", args.num_kv_heads)) if v}
    return dataclasses.replace(facts, **overrides)


def build_report(args) -> dict:
    """Everything the table and ``--json`` show. Raises ValueError for bad flag values."""
    from attnserve.attention.registry import backend_name, lookup_backend, registered_names
    from attnserve.attention.selector import (AttentionSelectorConfig, NoUsableBackendError, backend_reasons,
                                              select_attn_backend)
    from attnserve.config.attention import AttentionConfig
    from attnserve.platforms import detect_platform

    platform = detect_platform(args.device)
    facts = _model_facts(args)
    explicit = lookup_backend(args.attention_backend)
    attention_config = AttentionConfig(flash_attn_version=args.flash_attn_version)
    if args.block_size < 1:
        raise ValueError(f"--block-size {args.block_size} not allowed (allowed: integer >= 1)")
    cfg = AttentionSelectorConfig(
        head_size=facts.head_size, dtype=facts.dtype if args.dtype == "auto" else parse_dtype(args.dtype),
        kv_cache_dtype=args.kv_cache_dtype, block_size=args.block_size,
        sliding_window=args.sliding_window if args.sliding_window is not None else facts.sliding_window,
        logits_soft_cap=facts.logits_soft_cap)
    priority = [m.name for m in platform.backend_priorities()]
    names = priority + [n for n in registered_names() if n not in priority]
    backends = {}
    for name in names:
        reasons = backend_reasons(lookup_backend(name), cfg, platform, attention_config, args.assume_installed)[1]
        backends[name] = {"usable": not reasons, "reasons": reasons, "in_priority": name in priority}
    selected = error = version = layout = None
    try:
        sel = select_attn_backend(explicit, cfg, platform, attention_config, assume_installed=args.assume_installed)
        selected, version, layout = sel.name, sel.flash_attn_version, sel.kv_cache_layout.value
    except NoUsableBackendError as e:
        error = str(e)
    return {
        "platform": platform.to_dict(),
        "model": {"source": facts.source, "num_heads": facts.num_heads, "num_kv_heads": facts.num_kv_heads},
        "selector_config": cfg.to_dict(),
        "attention_config": {"backend": backend_name(explicit) if explicit else None,
                             "flash_attn_version": args.flash_attn_version},
        "assume_installed": args.assume_installed,
        "priority": priority,
        "backends": backends,
        "explicit": backend_name(explicit) if explicit else None,
        "selected": selected,
        "flash_attn_version": version,
        "kv_cache_layout": layout,
        "error": error,
    }


def render_plain(report: dict) -> str:
    """A plain-text table (used when stdout is not a terminal or rich is missing)."""
    cfg, plat = report["selector_config"], report["platform"]
    lines = [f"Platform: {plat['description']}" + ("  [packages assumed installed]" if report["assume_installed"] else ""),
             f"Model: {report['model']['source']}  (heads {report['model']['num_heads']}, "
             f"kv heads {report['model']['num_kv_heads']})",
             "Selector config: " + ", ".join(f"{k}={v}" for k, v in cfg.items()), ""]
    width = max(len(n) for n in report["backends"]) + 2
    lines.append(f"{'backend':<{width}}{'prio':<6}status")
    for name, entry in report["backends"].items():
        prio = str(report["priority"].index(name) + 1) if entry["in_priority"] else "-"
        status = "✓" if entry["usable"] else "✗ " + "; ".join(entry["reasons"])
        lines.append(f"{name:<{width}}{prio:<6}{status}")
    lines += ["", "Priority order: " + " > ".join(report["priority"]), _verdict(report)]
    return "\n".join(lines)


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
    console.print(f"[bold]Platform:[/bold] {plat['description']}"
                  + ("  [dim](packages assumed installed)[/dim]" if report["assume_installed"] else ""))
    console.print(f"[bold]Model:[/bold] {report['model']['source']}  "
                  + ", ".join(f"{k}={v}" for k, v in report["selector_config"].items()))
    table = Table(show_lines=False)
    for col in ("backend", "priority", "status"):
        table.add_column(col)
    for name, entry in report["backends"].items():
        prio = str(report["priority"].index(name) + 1) if entry["in_priority"] else "-"
        status = "[green]✓[/green]" if entry["usable"] else "[red]✗[/red] " + "\n".join(entry["reasons"])
        table.add_row(name, prio, status)
    console.print(table)
    console.print("Priority order: " + " > ".join(report["priority"]))
    console.print(f"[bold]{_verdict(report)}[/bold]")


def run_backends(args) -> int:
    """The subcommand body: 0, or 1 when an explicit backend cannot run, 2 for a bad flag value."""
    try:
        report = build_report(args)
    except ValueError as e:
        print(f"attnserve backends: error: {e}", file=sys.stderr)
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
        if report["error"] and report["explicit"]:
            print(report["error"], file=sys.stderr)
    return 1 if report["explicit"] and report["selected"] is None else 0


def main(argv: list[str] | None = None) -> int:
    """Run ``attnserve backends`` alone (tests, ``python -m attnserve.entrypoints.cli.backends``)."""
    parser = argparse.ArgumentParser(prog="attnserve backends")
    add_arguments(parser)
    return run_backends(parser.parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
