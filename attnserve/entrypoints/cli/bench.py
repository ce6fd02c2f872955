"""``attnserve bench serve``: load-test a running OpenAI-compatible server."""

from __future__ import annotations

import argparse
import asyncio
import json


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("bench", help="benchmarks", description="Benchmarks.")
    kinds = parser.add_subparsers(dest="bench_kind", metavar="KIND")
    kinds.required = True
    s = kinds.add_parser("serve", help="load-test a running server: TTFT, TPOT, ITL, throughput, errors",
                         description="Send streamed requests to a running OpenAI-compatible server and report "
                                     "TTFT/TPOT/ITL/E2E percentiles, throughput and errors.")
    s.add_argument("--base-url", default=None, help="server URL (default http://HOST:PORT)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--endpoint", default="/v1/completions", choices=["/v1/completions", "/v1/chat/completions"])
    s.add_argument("--model", default=None, help="model name (default: the server's first model)")
    s.add_argument("--num-prompts", type=int, default=100)
    s.add_argument("--request-rate", type=float, default=float("inf"),
                   help="requests per second, Poisson arrivals (default inf: all at once)")
    s.add_argument("--max-concurrency", type=int, default=None, help="most requests in flight")
    s.add_argument("--dataset", default="random", choices=["random", "file"])
    s.add_argument("--prompt-file", default=None, help="with --dataset file: one prompt per line, or JSONL 'prompt'")
    s.add_argument("--input-len", type=int, default=128, help="random prompts: words per prompt")
    s.add_argument("--output-len", type=int, default=128, help="max_tokens per request")
    s.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                   help="let requests stop at EOS (default: generate exactly --output-len tokens)")
    s.add_argument("--temperature", type=float, default=0.0)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--api-key", default=None)
    s.add_argument("--output-json", default=None, metavar="FILE", help="write the results as JSON")
    s.set_defaults(func=run_serve)
    return parser


def run_serve(args: argparse.Namespace) -> int:
    from attnserve.benchmarks.serving import BenchConfig, format_summary, run_benchmark

    if args.dataset == "file" and not args.prompt_file:
        raise SystemExit("attnserve bench serve: error: --dataset file needs --prompt-file")
    cfg = BenchConfig(
        base_url=args.base_url or f"http://{args.host}:{args.port}", endpoint=args.endpoint, model=args.model,
        num_prompts=args.num_prompts, request_rate=args.request_rate, max_concurrency=args.max_concurrency,
        input_len=args.input_len, output_len=args.output_len,
        prompt_file=args.prompt_file if args.dataset == "file" else None, ignore_eos=args.ignore_eos,
        temperature=args.temperature, seed=args.seed, api_key=args.api_key)
    summary = asyncio.run(run_benchmark(cfg))
    print(format_summary(summary))
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(summary, f, indent=2)
    return 0 if summary["completed"] else 1
