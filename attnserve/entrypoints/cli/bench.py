"""``attnserve bench KIND``: serve (load-test a running server: ``bench_serve.py``), throughput, latency (offline,
through the engine, optionally against transformers), attention (the attention backends' kernels).

The measuring code lives in ``attnserve/benchmarks/`` (one module per kind); this module holds the flags of
throughput and latency, ``bench_attention.py`` attention's, ``bench_results.py`` the results flags they share.
"""

from __future__ import annotations

import argparse

from attnserve.config.fields import range_words
from attnserve.entrypoints.cli.arg_types import checked, nonnegative_int, one_of, positive_int
from attnserve.entrypoints.cli.bench_attention import add_attention_parser
from attnserve.entrypoints.cli.bench_results import add_outputs, check_plot, finish
from attnserve.entrypoints.cli.bench_serve import add_serve_parser
from attnserve.refusals import Refused, message
from attnserve.refusals import bench as words
from attnserve.refusals.cli import at_argument, at_flag, unreadable_file


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("bench", help="benchmarks", description="Benchmarks.")
    kinds = parser.add_subparsers(dest="bench_kind", metavar="KIND")
    kinds.required = True
    add_serve_parser(kinds)
    _add_throughput(kinds)
    _add_latency(kinds)
    add_attention_parser(kinds)
    return parser


# flag types: a bad value exits 2 with one line naming the flag, the value and what is allowed (range_words' words)
_range_ratio = checked(float, lambda v: 0.0 <= v < 1.0, range_words("number", (">=", 0), ("<", 1)))


def _add_baseline(g) -> None:
    g.add_argument(
        "--baseline",
        default=None,
        **one_of(["transformers", "vllm"]),
        help="also run the same requests through transformers' generate (in this process) or vLLM (a "
        "subprocess, after the engine exits; needs vllm and a --model folder), with the same "
        "model, dtype and lengths, and report the ratio",
    )


def _add_throughput(kinds) -> None:
    from attnserve.entrypoints.cli.engine_args import add_engine_args

    p = kinds.add_parser(
        "throughput",
        help="offline throughput: many requests at once through the engine",
        description="Queue N requests (random token ids or --prompts-file), generate exactly the "
        "output length of each (EOS ignored, greedy), report requests/s and tokens/s "
        "and the % of the memory roofline. --seed (engine flag) seeds the requests.",
    )
    add_engine_args(p)
    g = p.add_argument_group("workload")
    g.add_argument(
        "--num-prompts",
        type=positive_int,
        default=None,
        help="requests (default 1000; with --prompts-file: the file's prompts, cycled to N if given)",
    )
    g.add_argument("--input-len", type=positive_int, default=None, help="prompt tokens (random prompts; default 128)")
    g.add_argument("--output-len", type=positive_int, default=128, help="tokens to generate per request")
    g.add_argument(
        "--range-ratio",
        type=_range_ratio,
        default=0.0,
        help="lengths uniform in [L(1-R), L(1+R)]; 0 = exactly L (default)",
    )
    g.add_argument(
        "--prompts-file",
        default=None,
        metavar="FILE",
        help="prompts instead of random token ids: one per line, or JSONL with 'prompt'",
    )
    g.add_argument(
        "--prefix-len",
        type=nonnegative_int,
        default=0,
        help="random prompts: one shared prefix of this many tokens before each prompt's own "
        "--input-len tokens (default 0)",
    )
    g.add_argument(
        "--num-turns",
        type=positive_int,
        default=1,
        help="random prompts: conversations of this many turns; turn k's prompt is turn k-1's prompt, "
        "its answer and a new message of --input-len tokens (default 1)",
    )
    g.add_argument(
        "--compare-prefix-caching",
        action="store_true",
        help="run the requests again on the same engine with prefix caching the other way, and report "
        "both and the ratios",
    )
    _add_baseline(g)
    add_outputs(p, "output tokens over time, per implementation")
    p.set_defaults(func=run_throughput)


def _add_latency(kinds) -> None:
    from attnserve.entrypoints.cli.engine_args import add_engine_args

    p = kinds.add_parser(
        "latency",
        help="latency of one batch: TTFT, TPOT, end-to-end, percentiles",
        description="Submit a batch of random prompts, generate exactly --output-len tokens each; "
        "report TTFT, TPOT, E2E percentiles, output tokens/s and the % of the memory "
        "roofline, for each --batch-size.",
    )
    add_engine_args(p)
    g = p.add_argument_group("workload")
    g.add_argument(
        "--batch-size",
        type=positive_int,
        nargs="+",
        default=[8],
        metavar="B",
        help="requests per batch; several values sweep (default 8)",
    )
    g.add_argument("--input-len", type=positive_int, default=32, help="prompt tokens (default 32)")
    g.add_argument("--output-len", type=positive_int, default=128, help="tokens to generate (default 128)")
    g.add_argument("--num-iters", type=positive_int, default=3, help="timed batches per batch size (default 3)")
    g.add_argument("--num-iters-warmup", type=nonnegative_int, default=1, help="untimed batches first (default 1)")
    g.add_argument(
        "--compare-tensor-parallel-sizes",
        type=positive_int,
        nargs="+",
        default=None,
        metavar="N",
        help="run the engine once per tensor-parallel size, in this run (e.g. 1 2); rows 'attnserve tpN'",
    )
    from attnserve.core.sampling_params import ALLOWED
    from attnserve.entrypoints.cli.arg_types import typed

    for name, off in (("presence_penalty", 0.0), ("frequency_penalty", 0.0), ("repetition_penalty", 1.0)):
        g.add_argument(
            f"--{name.replace('_', '-')}",
            type=typed(float, ALLOWED[name]),
            default=off,
            help=f"every request's {name} (default {off}: off)",
        )
    _add_baseline(g)
    add_outputs(p, "output tokens/s over batch size, with the roofline")
    p.set_defaults(func=run_latency)


def _check_baseline(args: argparse.Namespace, config) -> None:
    """Exit 2 naming --baseline when the baseline cannot run here (before any model loads)."""
    from attnserve.benchmarks.hf_baseline import check_transformers_baseline
    from attnserve.benchmarks.vllm_baseline import check_vllm_baseline

    try:
        if args.baseline == "vllm":
            check_vllm_baseline(config.model.model)
        elif args.baseline == "transformers":
            check_transformers_baseline(config.model.model, config.model.load_format)
    except Refused as e:
        args._engine_arg_parser.error(message(at_argument(e.refusal, "--baseline", written=e.refusal.written)))


def run_throughput(args: argparse.Namespace) -> int:
    from attnserve.benchmarks.requests import PromptsFileError
    from attnserve.entrypoints.cli.engine_args import engine_config_from_args, error_line

    config = engine_config_from_args(args)
    check_plot(args, args._engine_arg_parser)
    _check_baseline(args, config)
    random_only = (
        ("--input-len", args.input_len, None),
        ("--prefix-len", args.prefix_len, 0),
        ("--num-turns", args.num_turns, 1),
    )
    for flag, value, unused in random_only:
        if value != unused and args.prompts_file:
            args._engine_arg_parser.error(message(words.with_prompts_file(flag, value)))
    if args.num_turns > 1 and args.baseline:
        args._engine_arg_parser.error(message(at_argument(words.turns_with_baseline(args.num_turns), "--num-turns")))
    from attnserve.benchmarks.plots import plot_throughput
    from attnserve.benchmarks.throughput import run_throughput as run

    try:
        result = run(
            config,
            num_prompts=args.num_prompts,
            input_len=None if args.prompts_file else (args.input_len or 128),
            output_len=args.output_len,
            range_ratio=args.range_ratio,
            prompts_file=args.prompts_file,
            baseline=args.baseline,
            progress=args.progress,
            prefix_len=args.prefix_len,
            num_turns=args.num_turns,
            compare_prefix_caching=args.compare_prefix_caching,
        )
    except OSError as e:  # the prompts file, or a model that is not there (whose message names it)
        if e.filename is not None and e.filename == args.prompts_file:
            args._engine_arg_parser.error(message(unreadable_file("--prompts-file", e.filename, e.strerror)))
        args._engine_arg_parser.error(str(e))
    except PromptsFileError as e:  # not UTF-8 text, or no prompts in it
        args._engine_arg_parser.error(message(at_flag(e.refusal, "--prompts-file")))
    except ValueError as e:
        args._engine_arg_parser.error(error_line(args, e))
    return finish(args, result, plot_throughput)


def _penalties(args: argparse.Namespace) -> dict:
    """The penalty flags that are not off, as SamplingParams fields."""
    off = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0}
    return {k: getattr(args, k) for k, v in off.items() if getattr(args, k) != v}


def _check_penalty(args: argparse.Namespace, field: str, value: float) -> None:
    """Exit 2 at the penalty's flag for a value SamplingParams refuses, before any model loads."""
    from attnserve.core.sampling_params import SamplingParams

    try:
        SamplingParams(**{field: value})
    except Refused as e:
        flag = "--" + field.replace("_", "-")
        args._engine_arg_parser.error(message(at_argument(e.refusal, flag, written=e.refusal.written)))


def run_latency(args: argparse.Namespace) -> int:
    from attnserve.entrypoints.cli.engine_args import engine_config_from_args, error_line

    config = engine_config_from_args(args)
    check_plot(args, args._engine_arg_parser)
    _check_baseline(args, config)
    for field, value in _penalties(args).items():
        if args.baseline:  # the baseline would run without it
            args._engine_arg_parser.error(message(words.penalty_with_baseline(field, value, args.baseline)))
        _check_penalty(args, field, value)
    largest, max_num_seqs = max(args.batch_size), config.scheduler.max_num_seqs
    if largest > max_num_seqs:
        args._engine_arg_parser.error(message(words.batch_beyond_max_num_seqs(largest, max_num_seqs)))
    from attnserve.benchmarks.latency import run_latency as run
    from attnserve.benchmarks.plots import plot_latency

    try:
        result = run(
            config,
            batch_sizes=args.batch_size,
            input_len=args.input_len,
            output_len=args.output_len,
            num_iters=args.num_iters,
            num_iters_warmup=args.num_iters_warmup,
            baseline=args.baseline,
            progress=args.progress,
            tensor_parallel_sizes=args.compare_tensor_parallel_sizes,
            sampling=_penalties(args),
        )
    except (OSError, ValueError) as e:
        key = getattr(e, "key", None)
        if key == "tensor_parallel_size" and args.compare_tensor_parallel_sizes:  # the sizes run are this flag's
            args._engine_arg_parser.error(
                message(e.refusal.at("argument --compare-tensor-parallel-sizes", written=e.refusal.written))
            )
        args._engine_arg_parser.error(error_line(args, e))
    return finish(args, result, plot_latency)
