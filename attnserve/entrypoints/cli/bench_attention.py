"""``attnserve bench attention``: the flags of the attention-kernel benchmark and its run
(``attnserve/benchmarks/attention.py`` times the backends)."""

from __future__ import annotations

import argparse
import sys

from attnserve.config.cache import BLOCK_SIZES, KV_CACHE_DTYPES
from attnserve.entrypoints.cli.arg_types import checked, nonnegative_int, one_of, positive_int
from attnserve.entrypoints.cli.bench_results import add_outputs, check_plot, finish
from attnserve.refusals import Refused, message
from attnserve.refusals import bench as words


def add_attention_parser(kinds) -> None:
    p = kinds.add_parser(
        "attention",
        help="attention kernels: each usable backend on decode and prefill shapes",
        description="Time each usable attention backend's forward on a paged KV cache: decode "
        "(B requests x context C) and causal prefill (one sequence of L tokens); "
        "report microseconds, TB/s of KV read and TFLOP/s.",
    )
    g = p.add_argument_group("shape")
    g.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)")
    g.add_argument(
        "--dtype",
        default="auto",
        **one_of(["auto", "float32", "float16", "bfloat16"]),
        help="auto = bfloat16 on GPU, float32 on CPU",
    )
    g.add_argument("--num-heads", type=positive_int, default=32, help="query heads (default 32)")
    g.add_argument("--num-kv-heads", type=positive_int, default=8, help="KV heads (default 8)")
    g.add_argument("--head-size", type=positive_int, default=128, help="default 128")
    g.add_argument(
        "--block-size",
        type=checked(int, lambda v: v in BLOCK_SIZES, ", ".join(map(str, BLOCK_SIZES))),
        default=16,
        help="KV-cache block size, as the engine's --block-size takes it (default 16)",
    )
    g.add_argument(
        "--kv-cache-dtype",
        default="auto",
        **one_of(list(KV_CACHE_DTYPES)),
        help="KV-cache element type, as the engine's --kv-cache-dtype takes it (default auto = --dtype); "
        "backends that cannot read it are skipped with the reason",
    )
    g.add_argument(
        "--batch-size", type=positive_int, default=None, help="decode requests (default 64 on GPU, 8 on CPU)"
    )
    g.add_argument(
        "--context-lens",
        type=positive_int,
        nargs="*",
        default=None,
        metavar="C",
        help="decode context lengths (default 512..8192 on GPU, 128..1024 on CPU; none given: no decode case)",
    )
    g.add_argument(
        "--prefill-lens",
        type=positive_int,
        nargs="*",
        default=None,
        metavar="L",
        help="prefill sequence lengths (default 512..8192 on GPU, 128..1024 on CPU; none given: no prefill case)",
    )
    g.add_argument(
        "--backends",
        nargs="+",
        default=None,
        metavar="NAME",
        help="only these backends (default, or auto among them: the platform's priority list)",
    )
    g.add_argument(
        "--attention-config",
        "-ac",
        default=None,
        metavar="JSON",
        help="backend options as the engine's --attention-config JSON takes them, e.g. "
        "'{\"disable_flashinfer_q_quantization\": true}' (default: none set)",
    )
    g.add_argument("--warmup", type=nonnegative_int, default=3, help="untimed calls first (default 3)")
    g.add_argument("--repeats", type=positive_int, default=10, help="timed calls; the median is reported")
    add_outputs(p, "per-backend kernel time over context length")
    p.set_defaults(func=run_attention, _bench_parser=p)


def _attention_config(text: str | None):
    """``--attention-config``'s JSON object as an AttentionConfig (None when not given); raises ValueError for
    text that is not a JSON object, ConfigError (a ValueError) for an unknown field or value."""
    if text is None:
        return None
    import json

    from attnserve.config.attention import AttentionConfig

    try:
        values = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"argument --attention-config: not JSON ({e.msg}): {text!r}") from None
    config = AttentionConfig.from_dict(values)
    if config.backend is not None:  # it would pick nothing here: the backends timed are --backends'
        raise ValueError("argument --attention-config: 'backend' is not taken here; use --backends NAME")
    return config


def run_attention(args: argparse.Namespace) -> int:
    from attnserve.attention.registry import UnknownBackendError
    from attnserve.benchmarks.attention import run_attention as run
    from attnserve.benchmarks.plots import plot_attention

    check_plot(args, args._bench_parser)
    if args.num_heads % args.num_kv_heads:
        args._bench_parser.error(message(words.heads_not_grouped(args.num_heads, args.num_kv_heads)))
    if args.context_lens == [] and args.prefill_lens == []:  # both given empty: no case to time
        args._bench_parser.error(message(words.nothing_to_time()))
    try:
        attention_config = _attention_config(args.attention_config)
        result = run(
            device=args.device,
            dtype=args.dtype,
            num_heads=args.num_heads,
            num_kv_heads=args.num_kv_heads,
            head_size=args.head_size,
            block_size=args.block_size,
            kv_cache_dtype=args.kv_cache_dtype,
            batch_size=args.batch_size,
            context_lens=args.context_lens,
            prefill_lens=args.prefill_lens,
            backends=args.backends,
            warmup=args.warmup,
            repeats=args.repeats,
            progress=args.progress,
            attention_config=attention_config,
        )
    except UnknownBackendError as e:
        args._bench_parser.error(message(e.refusal.at("argument --backends", written=e.refusal.written)))
    except Refused as e:  # an -ac field no timed backend reads is placed at the flag
        r = e.refusal
        ac = r.path == ("attention_config",)
        args._bench_parser.error(message(r.at("argument --attention-config", names_path=True) if ac else r))
    except ValueError as e:
        args._bench_parser.error(str(e))
    if not result["backends"] and args.backends:  # the backends asked for cannot run: a bad value, as generate's
        args._bench_parser.error(message(words.no_backend_runs(args.backends, result["device"], result["skipped"])))
    if not result["backends"]:  # nothing installed could run: say why (the table lists the reasons) and fail
        print(result["table"])
        print(f"attnserve bench attention: error: {words.no_usable_backend(result['device'])}", file=sys.stderr)
        return 1
    return finish(args, result, plot_attention)
