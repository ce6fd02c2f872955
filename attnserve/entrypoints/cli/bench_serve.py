"""``attnserve bench serve``: load-test a running OpenAI-compatible server (the measuring code is
``attnserve/benchmarks/serving.py``); its flags, and the run that checks them and prints the summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math

from attnserve.config.fields import range_words
from attnserve.config.model import SEED_MAX, SEED_MIN
from attnserve.refusals.sampling import SEED_WORDS
from attnserve.entrypoints.cli.arg_types import checked, nonnegative_int, one_of, output_file, positive_int
from attnserve.refusals import message
from attnserve.refusals import bench as words
from attnserve.refusals.cli import at_flag, unreadable_file

# flag types: a bad value exits 2 with one line naming the flag, the value and what is allowed (range_words' words)
_request_rate = checked(float, lambda v: v > 0.0, range_words("number", (">", 0), None) + ", or inf")  # nan fails too
_server_port = checked(int, lambda v: 1 <= v <= 65535, range_words("integer", (">=", 1), ("<=", 65535)))
_temperature = checked(
    float,
    lambda v: math.isfinite(v) and v >= 0.0,  # as the server's
    range_words("finite number", (">=", 0), None),
)


def add_serve_parser(kinds) -> None:
    """``bench serve``'s flags on the ``bench`` subparsers ``kinds``."""
    s = kinds.add_parser(
        "serve",
        help="load-test a running server: TTFT, TPOT, ITL, throughput, errors",
        description="Send streamed requests to a running OpenAI-compatible server and report "
        "TTFT/TPOT/ITL/E2E percentiles, throughput and errors.",
    )
    s.add_argument("--base-url", default=None, help="server URL (default http://HOST:PORT)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=_server_port, default=8000)
    s.add_argument("--endpoint", default="/v1/completions", **one_of(["/v1/completions", "/v1/chat/completions"]))
    s.add_argument("--model", default=None, help="model name (default: the server's first model)")
    s.add_argument("--num-prompts", type=positive_int, default=100)
    s.add_argument(
        "--request-rate",
        type=_request_rate,
        default=float("inf"),
        help="requests per second, Poisson arrivals (default inf: all at once)",
    )
    s.add_argument("--max-concurrency", type=positive_int, default=None, help="most requests in flight")
    s.add_argument(
        "--dataset",
        default=None,
        **one_of(["random", "file"]),
        help="random words, or the prompts of --prompt-file (default: file with --prompt-file, else random)",
    )
    s.add_argument(
        "--prompt-file",
        "--prompts-file",  # bench throughput's spelling
        default=None,
        help="one prompt per line, or JSONL 'prompt' (implies --dataset file)",
    )
    s.add_argument(
        "--input-len", type=positive_int, default=None, help="random prompts: words per prompt (default 128)"
    )
    s.add_argument("--output-len", type=positive_int, default=128, help="max_tokens per request")
    s.add_argument(
        "--prefix-len",
        type=nonnegative_int,
        default=0,
        help="random prompts: one shared prefix of this many words before each prompt's own (default 0)",
    )
    s.add_argument(
        "--num-turns",
        type=positive_int,
        default=1,
        help="conversations of this many turns, sent in order: turn k's prompt (or messages) holds turn "
        "k-1's and its answer, then a new message of --input-len words (default 1)",
    )
    s.add_argument(
        "--no-ignore-eos",
        dest="ignore_eos",
        action="store_false",
        help="let requests stop at EOS (default: generate exactly --output-len tokens)",
    )
    s.add_argument("--temperature", type=_temperature, default=0.0, help="each request's temperature (default 0)")
    s.add_argument(
        "--seed",
        type=checked(int, lambda v: SEED_MIN <= v <= SEED_MAX, SEED_WORDS),
        default=0,
        help="seeds the random prompts and the arrival times (any 64-bit integer, as the engine's --seed)",
    )
    s.add_argument("--api-key", default=None)
    s.add_argument("--output-json", type=output_file, default=None, metavar="FILE", help="write the results as JSON")
    s.set_defaults(func=run_serve, _bench_parser=s)


def _base_url(args: argparse.Namespace) -> str:
    """--base-url, else http://HOST:PORT (an IPv6 host in brackets); exits 2 with one line for a URL that no
    request could go to (httpx would raise mid-run, with a traceback)."""
    import httpx

    host = f"[{args.host}]" if ":" in args.host and not args.host.startswith("[") else args.host
    url = args.base_url or f"http://{host}:{args.port}"
    try:
        parsed = httpx.URL(url)
        ok = parsed.scheme in ("http", "https") and bool(parsed.host) and 1 <= (parsed.port or 80) <= 65535
    except httpx.InvalidURL:
        ok = False
    if not ok and args.base_url:
        args._bench_parser.error(message(words.at("--base-url", args.base_url, allowed=words.BASE_URL_WORDS)))
    if not ok:
        args._bench_parser.error(message(words.at("--host", args.host, allowed=words.HOST_WORDS)))
    return url


def run_serve(args: argparse.Namespace) -> int:
    from attnserve.benchmarks.requests import PromptsFileError
    from attnserve.benchmarks.serving import BenchConfig, BenchServerError, format_summary, run_benchmark

    if args.dataset is None:  # a prompt file is what the user wants benchmarked, not random words beside it
        args.dataset = "file" if args.prompt_file else "random"
    if args.dataset == "file" and not args.prompt_file:
        args._bench_parser.error(message(words.FILE_NEEDS_PROMPT_FILE))
    for flag, value in (("--prefix-len", args.prefix_len), ("--input-len", args.input_len)):
        if args.dataset == "file" and value:
            args._bench_parser.error(message(words.with_prompts_file(flag, value, "a prompt file")))
    if args.dataset == "random" and args.prompt_file:
        args._bench_parser.error(message(words.PROMPT_FILE_UNUSED))
    cfg = BenchConfig(
        base_url=_base_url(args),
        endpoint=args.endpoint,
        model=args.model,
        num_prompts=args.num_prompts,
        request_rate=args.request_rate,
        max_concurrency=args.max_concurrency,
        input_len=args.input_len or BenchConfig.input_len,  # its default: random prompts only
        output_len=args.output_len,
        prefix_len=args.prefix_len,
        num_turns=args.num_turns,
        prompt_file=args.prompt_file if args.dataset == "file" else None,
        ignore_eos=args.ignore_eos,
        temperature=args.temperature,
        seed=args.seed,
        api_key=args.api_key,
    )
    try:
        summary = asyncio.run(run_benchmark(cfg))
    except OSError as e:  # the prompt file
        args._bench_parser.error(message(unreadable_file("--prompt-file", e.filename, e.strerror)))
    except PromptsFileError as e:  # not UTF-8 text, no prompts in it, or a malformed JSONL line
        args._bench_parser.error(message(at_flag(e.refusal, "--prompt-file")))
    except ValueError as e:
        args._bench_parser.error(str(e))
    except BenchServerError as e:
        raise SystemExit(f"attnserve bench serve: error: {e}") from None
    print(format_summary(summary))
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(summary, f, indent=2)
    return 0 if summary["completed"] else 1
