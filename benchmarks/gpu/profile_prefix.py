"""Where the time to first token of the shared-prefix workload goes: its steps, and the kernels of one of them.

``python -m benchmarks.gpu.profile_prefix [--model benchmarks/shapes/qwen3-0.6b] [--tokenizer DIR] [--json OUT]``

256 prompts of one shared 2048-token prefix + 128 own tokens, 128 output tokens (docs/benchmarks.md's
prefix-caching workload), prefix caching on. Every ``engine.step()`` is recorded (prefill tokens, decode rows,
wall ms) until every request has its first token; then the same workload runs again (cache reset) under
``torch.profiler`` for its first prefill steps, and the CUDA kernels are summed by name.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import json

import torch

from benchmarks.gpu.profile_throughput import _run


def _requests(vocab: int, seed: int, num: int = 256, prefix: int = 2048):
    from attnserve.benchmarks.requests import random_requests

    return random_requests(num, 128, 128, 0.0, min(vocab, 49152), seed, prefix_len=prefix)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="benchmarks/shapes/qwen3-0.6b")
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--profile-steps", type=int, default=3)
    ap.add_argument("--num-prompts", type=int, default=256)
    ap.add_argument("--prefix-len", type=int, default=2048)
    ap.add_argument("--cprofile-steps", type=int, default=3, help="then profile the first N steps' host time")
    ap.add_argument("--json")
    ap.add_argument("engine_kwargs", nargs="*", help="extra LLM keyword arguments, key=value")
    a = ap.parse_args()
    from attnserve import LLM

    kw = {}
    for item in a.engine_kwargs:
        k, v = item.split("=", 1)
        kw[k] = {"true": True, "false": False}.get(v, int(v) if v.isdigit() else v)
    llm = LLM(
        a.model,
        tokenizer=a.tokenizer,
        load_format="dummy",
        dtype="bfloat16" if torch.cuda.is_available() else "float32",
        max_model_len=4096,
        seed=0,
        **kw,
    )
    engine = llm.engine
    vocab = engine.runner.dims.vocab_size
    _run(engine, _requests(vocab, 1, a.num_prompts, a.prefix_len), None)
    engine.reset_prefix_cache()
    steps: list = []
    wall = _run(engine, _requests(vocab, 0, a.num_prompts, a.prefix_len), steps)
    cum, timeline = 0.0, []
    for p, d, t in steps[:12]:
        cum += t
        timeline.append({"prefill_tokens": p, "decodes": d, "ms": round(t * 1e3, 2), "cum_ms": round(cum * 1e3, 1)})
    print(json.dumps({"flags": kw, "wall_s": wall, "steps": len(steps), "timeline": timeline}, indent=1), flush=True)
    engine.reset_prefix_cache()
    from torch.profiler import ProfilerActivity, profile

    reqs = _requests(vocab, 2, a.num_prompts, a.prefix_len)
    from attnserve.core.sampling_params import SamplingParams

    for r in reqs:
        engine.add_request(
            r.prompt_token_ids,
            SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True, detokenize=False),
        )
    kernels = []
    for i in range(a.profile_steps):
        acts = [ProfilerActivity.CUDA] if torch.cuda.is_available() else [ProfilerActivity.CPU]
        with profile(activities=acts) as prof:
            engine.step()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
        rows = sorted(
            ((e.key, (e.device_time_total or e.cpu_time_total) / 1e3, e.count) for e in prof.key_averages()),
            key=lambda x: -x[1],
        )
        total = sum(r[1] for r in rows)
        kernels.append(
            {"step": i, "gpu_ms": round(total, 2), "top": [[k[:90], round(ms, 2), n] for k, ms, n in rows[:14]]}
        )
        print(json.dumps(kernels[-1], indent=1), flush=True)
    while engine.has_unfinished_requests():
        engine.step()
    if a.cprofile_steps:
        engine.reset_prefix_cache()
        prof = cProfile.Profile()
        for r in _requests(vocab, 3, a.num_prompts, a.prefix_len):
            engine.add_request(
                r.prompt_token_ids,
                SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True, detokenize=False),
            )
        for _ in range(a.cprofile_steps):
            prof.enable()
            engine.step()
            prof.disable()
        while engine.has_unfinished_requests():
            engine.step()
        for order in ("tottime", "cumulative"):
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats(order).print_stats(35)
            print(f"==== cProfile, first {a.cprofile_steps} steps, by {order} ====\n{buf.getvalue()}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"flags": kw, "wall_s": wall, "timeline": timeline, "kernels": kernels}, f, indent=1)


if __name__ == "__main__":
    main()
