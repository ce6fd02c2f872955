"""Where the time of the nano-vllm throughput workload goes, step by step, and where the host spends it.

``python -m benchmarks.gpu.profile_throughput [--model benchmarks/shapes/qwen3-0.6b] --tokenizer DIR
[--max-num-batched-tokens N] [--cprofile-steps 40] [--json OUT]`` on a GPU.

The workload of ``bench throughput`` (256 requests, input and output lengths U[100, 1024]) runs once to warm
up and once timed. Every ``engine.step()`` is recorded with the step it scheduled (prefill tokens, decode
rows) and its wall time; the report sums the time by kind of step (with prefill tokens, decode only) and
gives the decode-only step time by batch size. A third run profiles the first ``--cprofile-steps`` steps and
a window of decode-only steps with cProfile (host time by Python function). ``--kernel-steps N``: a fourth run
records the GPU kernels of N decode-only steps at batch >= 128 (torch.profiler): GPU time per step by kernel, the
context tokens those steps read, and the KV bytes per second of the kernels named like attention.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time

import torch


def _requests(vocab: int, seed: int, num: int = 256, length: int = 562):
    from attnserve.benchmarks.requests import random_requests

    return random_requests(num, length, length, 0.822, min(vocab, 49152), seed)


def _run(
    engine, requests, record: list | None, prof_first: int = 0, prof_decode: int = 0, kernels: dict | None = None
) -> float:
    from attnserve.core.sampling_params import SamplingParams

    for r in requests:
        engine.add_request(
            r.prompt_token_ids,
            SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True, detokenize=False),
        )
    sched = engine.scheduler
    original = sched.schedule
    last: list = []

    def schedule():
        out = original()
        prefill = sum(len(q.token_ids) for q in out.requests if len(q.token_ids) > 1)
        decodes = [q for q in out.requests if len(q.token_ids) == 1]
        last[:] = [prefill, len(decodes), sum(q.start_position + 1 for q in decodes)]
        return out

    sched.schedule = schedule
    profs = {"first": cProfile.Profile(), "decode": cProfile.Profile()}
    n = decode_seen = 0
    window = None  # the kernel profile's torch.profiler, while it records

    def close_window() -> None:  # its kernels (name, device us) into ``kernels``; no second window after it
        torch.cuda.synchronize()
        window.stop()
        cuda = torch.autograd.DeviceType.CUDA
        kernels["events"] = [(e.name, e.device_time) for e in window.events() if e.device_type == cuda]
        kernels["want"] = kernels["steps"]

    t0 = time.perf_counter()
    while engine.has_unfinished_requests():
        if kernels is not None and last and last[0] == 0 and last[1] >= 128 and kernels["steps"] < kernels["want"]:
            if window is None:
                torch.cuda.synchronize()
                window = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
                window.start()
            kernels["steps"] += 1
            kernels["context_tokens"] += last[2]
            kernels["decode_rows"] += last[1]
        elif window is not None:
            close_window()
            window = None
        prof = None
        if n < prof_first:
            prof = profs["first"]
        elif prof_decode and last and last[0] == 0 and last[1] >= 128 and decode_seen < prof_decode:
            prof = profs["decode"]
            decode_seen += 1
        s = time.perf_counter()
        if prof is not None:
            prof.enable()
        engine.step()
        if prof is not None:
            prof.disable()
        if record is not None:
            record.append((last[0], last[1], time.perf_counter() - s))
        n += 1
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    if window is not None:  # the run ended inside the window
        close_window()
    sched.schedule = original
    wall = time.perf_counter() - t0
    if prof_first or prof_decode:
        for name, p in profs.items():
            buf = io.StringIO()
            pstats.Stats(p, stream=buf).sort_stats("tottime").print_stats(30)
            print(f"==== cProfile {name} ====\n{buf.getvalue()}", flush=True)
            buf = io.StringIO()
            pstats.Stats(p, stream=buf).sort_stats("cumulative").print_stats(30)
            print(f"==== cProfile {name} (cumulative) ====\n{buf.getvalue()}", flush=True)
    return wall


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="benchmarks/shapes/qwen3-0.6b")
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--max-num-batched-tokens", type=int, default=None)
    ap.add_argument("--attention-backend", default=None)
    ap.add_argument("--cprofile-steps", type=int, default=40)
    ap.add_argument("--cprofile-decode-steps", type=int, default=50)
    ap.add_argument("--num-prompts", type=int, default=256)
    ap.add_argument("--length", type=int, default=562)
    ap.add_argument("--kernel-steps", type=int, default=0, help="decode-only steps whose GPU kernels are recorded")
    ap.add_argument("--json")
    args = ap.parse_args()
    from attnserve import LLM

    kw = {} if args.max_num_batched_tokens is None else {"max_num_batched_tokens": args.max_num_batched_tokens}
    if args.attention_backend:
        kw["attention_backend"] = args.attention_backend
    llm = LLM(
        args.model,
        tokenizer=args.tokenizer,
        load_format="dummy",
        dtype="bfloat16" if torch.cuda.is_available() else "float32",
        max_model_len=2304,
        max_num_seqs=256,
        seed=0,
        **kw,
    )
    engine = llm.engine
    vocab = engine.runner.dims.vocab_size
    _run(engine, _requests(vocab, 1, args.num_prompts, args.length), None)
    engine.reset_prefix_cache()
    steps: list = []
    wall = _run(engine, _requests(vocab, 0, args.num_prompts, args.length), steps)
    out_tokens = sum(r.output_len for r in _requests(vocab, 0, args.num_prompts, args.length))
    prefill = [s for s in steps if s[0] > 0]
    decode = [s for s in steps if s[0] == 0 and s[1] > 0]
    by_batch: dict[int, list] = {}
    for _, b, t in decode:
        by_batch.setdefault(-(-b // 32) * 32, []).append(t)  # the batch size rounded up to 32
    report = {
        "flags": kw,
        "wall_s": wall,
        "output_tok_per_s": out_tokens / wall,
        "steps": len(steps),
        "prefill_steps": len(prefill),
        "prefill_steps_s": sum(s[2] for s in prefill),
        "prefill_tokens": sum(s[0] for s in prefill),
        "decode_steps": len(decode),
        "decode_steps_s": sum(s[2] for s in decode),
        "other_steps_s": sum(s[2] for s in steps if s[0] == 0 and s[1] == 0),
        "decode_ms_by_batch_upto": {k: [len(v), round(1e3 * sum(v) / len(v), 3)] for k, v in sorted(by_batch.items())},
        "first_steps": [[p, d, round(t * 1e3, 2)] for p, d, t in steps[:40]],
    }
    print(json.dumps(report, indent=1), flush=True)
    engine.reset_prefix_cache()
    _run(
        engine,
        _requests(vocab, 2, args.num_prompts, args.length),
        None,
        args.cprofile_steps,
        args.cprofile_decode_steps,
    )
    if args.kernel_steps:
        report["kernels"] = _kernel_window(
            engine, _requests(vocab, 3, args.num_prompts, args.length), args.kernel_steps
        )
        print(json.dumps(report["kernels"], indent=1), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


def _kernel_window(engine, requests, steps: int) -> dict:
    """GPU time per decode step by kernel over ``steps`` decode-only steps at batch >= 128, and the KV bytes per
    second of the kernels whose name says attention (their time against the context the steps read)."""
    from attnserve.benchmarks.roofline import kv_bytes_per_token

    engine.reset_prefix_cache()
    rec = {"want": steps, "steps": 0, "context_tokens": 0, "decode_rows": 0, "events": []}
    _run(engine, requests, None, kernels=rec)
    n = max(rec["steps"], 1)
    by_name: dict[str, list] = {}
    for name, us in rec["events"]:
        entry = by_name.setdefault(name[:90], [0, 0.0])
        entry[0] += 1
        entry[1] += us
    dims = engine.runner.dims
    per_token = kv_bytes_per_token(dims.num_layers, dims.num_kv_heads, dims.head_size, torch.bfloat16)
    attn_us = sum(us for name, (_, us) in by_name.items() if "attention" in name.lower() or "attn" in name.lower())
    total_us = sum(us for _, us in by_name.values())
    return {
        "steps": rec["steps"],
        "mean_batch": rec["decode_rows"] / n,
        "mean_context": rec["context_tokens"] / max(rec["decode_rows"], 1),
        "gpu_ms_per_step": total_us / 1e3 / n,
        "attention_ms_per_step": attn_us / 1e3 / n,
        "attention_kv_TBps": rec["context_tokens"] * per_token / (attn_us * 1e-6) / 1e12 if attn_us else None,
        "by_kernel_ms_per_step": sorted(
            ([name, count / n, round(us / 1e3 / n, 4)] for name, (count, us) in by_name.items()),
            key=lambda r: -r[2],
        )[:20],
    }


if __name__ == "__main__":
    main()
