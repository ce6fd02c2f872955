"""Where the prefill of a batch goes: 64 x 1024-token prompts, one output token each, through the engine.

``python -m benchmarks.gpu.profile_prefill [--model benchmarks/shapes/qwen3-0.6b] [--tokenizer DIR]
[--backends FLASH_ATTN TRITON_ATTN] [--budgets 2048 16384] [--json OUT]`` on a GPU.

Per backend and step token budget (``max_num_batched_tokens``): the wall time to every request's first token,
the engine steps, then the same batch under the profiler: GPU busy time (sum of kernel durations), idle time
(wall minus busy: the host), and the kernels that take the most time.
"""

from __future__ import annotations

import argparse
import gc
import json
import time

import torch


def _batch(engine, reqs, params) -> int:
    for r in reqs:
        engine.add_request(r.prompt_token_ids, params)
    steps = 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return steps


def run_one(args, backend: str, budget: int) -> dict:
    from torch.profiler import ProfilerActivity, profile

    from attnserve import LLM
    from attnserve.benchmarks.latency import iteration_requests
    from attnserve.core.sampling_params import SamplingParams

    llm = LLM(
        args.model,
        tokenizer=args.tokenizer,
        load_format="dummy",
        dtype="bfloat16",
        attention_backend=backend,
        max_model_len=2304,
        max_num_seqs=256,
        max_num_batched_tokens=budget,
    )
    engine = llm.engine
    vocab = engine.runner.dims.vocab_size
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, detokenize=False)
    reqs = lambda it: iteration_requests(args.batch_size, args.input_len, 1, min(vocab, 49152), 0, it)  # noqa: E731
    _batch(engine, reqs(0), params)
    t0 = time.perf_counter()
    steps = _batch(engine, reqs(1), params)
    wall = time.perf_counter() - t0
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        _batch(engine, reqs(2), params)
        prof_wall = time.perf_counter() - t0
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = sum(e.device_time for e in kernels) / 1e3
    by: dict[str, list] = {}
    for e in kernels:
        r = by.setdefault(e.name[:80], [0, 0.0])
        r[0] += 1
        r[1] += e.device_time / 1e3
    cpu = sorted(((e.key, e.self_cpu_time_total / 1e3, e.count) for e in prof.key_averages()), key=lambda x: -x[1])[:15]
    out = {
        "backend": backend,
        "budget": budget,
        "ms_to_first_tokens": wall * 1e3,
        "steps": steps,
        "profiled_wall_ms": prof_wall * 1e3,
        "gpu_busy_ms": busy,
        "top_kernels_ms": sorted(([k, n, round(t, 2)] for k, (n, t) in by.items()), key=lambda x: -x[2])[:15],
        "top_cpu_self_ms": [[k[:80], round(t, 2), n] for k, t, n in cpu],
    }
    del engine, llm
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="benchmarks/shapes/qwen3-0.6b")
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--backends", nargs="+", default=["FLASH_ATTN", "TRITON_ATTN"])
    ap.add_argument("--budgets", nargs="+", type=int, default=[2048, 16384])
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=1024)
    ap.add_argument("--json")
    args = ap.parse_args()
    results = []
    for backend in args.backends:
        for budget in args.budgets:
            r = run_one(args, backend, budget)
            results.append(r)
            print(json.dumps(r, indent=1), flush=True)
    for r in results:
        print(
            f"{r['backend']:<12} budget {r['budget']:>6}: {r['ms_to_first_tokens']:8.1f} ms, {r['steps']:3d} steps, "
            f"GPU busy {r['gpu_busy_ms']:8.1f} of {r['profiled_wall_ms']:8.1f} ms profiled"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
