"""Where the time to first token of the shared-prefix workload goes: its steps, and the kernels of one of them.

``python -m benchmarks.gpu.profile_prefix [--model benchmarks/shapes/qwen3-0.6b] [--tokenizer DIR] [--json OUT]``

256 prompts of one shared 2048-token prefix + 128 own tokens, 128 output tokens (docs/benchmarks.md's
prefix-caching workload), prefix caching on. Every ``engine.step()`` is recorded (prefill tokens, decode rows,
wall ms); then the same workload runs again (cache reset) under ``torch.profiler`` for its first steps: each
step's host window, the device's busy time and idle gaps (``--trace``: the chrome trace); then again under
cProfile (host time by function).
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


def _profile_steps(engine, num_steps: int, trace: str | None) -> dict:
    """Run ``num_steps`` engine steps under torch.profiler (CPU and CUDA): each step's host window, the device's
    busy time, the device's idle gaps over 0.5 ms (when, how long, in which step's host window) and the kernels
    by total time. The gaps say where the host, not the GPU, set the pace."""
    from torch.profiler import ProfilerActivity, profile, record_function

    cuda = torch.cuda.is_available()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        for i in range(num_steps):
            with record_function(f"engine step {i}"):
                engine.step()
        if cuda:
            torch.cuda.synchronize()
    if trace:
        prof.export_chrome_trace(trace)
    events = prof.events()
    steps = sorted((e.time_range.start, e.time_range.end, e.name) for e in events if e.name.startswith("engine step "))
    kernels = sorted(
        (e.time_range.start, e.time_range.end, e.name)
        for e in events
        if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start
    )
    t0 = steps[0][0] if steps else 0
    busy, gaps, last_end = 0.0, [], None
    for start, end, _ in kernels:
        if last_end is not None and start - last_end > 500:
            host = next((n for s, e, n in steps if s <= last_end <= e), "between steps")
            gaps.append([round((last_end - t0) / 1e3, 2), round((start - last_end) / 1e3, 2), host])
        if last_end is None or end > last_end:
            busy += (end - max(start, last_end or start)) / 1e3
            last_end = end
    by_name: dict[str, float] = {}
    for start, end, name in kernels:
        by_name[name[:90]] = by_name.get(name[:90], 0.0) + (end - start) / 1e3
    report = {
        "steps_ms": [[n, round((s - t0) / 1e3, 2), round((e - s) / 1e3, 2)] for s, e, n in steps],
        "device_busy_ms": round(busy, 2),
        "device_span_ms": round(((kernels[-1][1] - kernels[0][0]) / 1e3) if kernels else 0.0, 2),
        "idle_gaps_over_0.5ms": gaps[:40],
        "top_kernels_ms": sorted(([k, round(v, 2)] for k, v in by_name.items()), key=lambda x: -x[1])[:15],
    }
    print(json.dumps(report, indent=1), flush=True)
    return report


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="benchmarks/shapes/qwen3-0.6b")
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--profile-steps", type=int, default=4)
    ap.add_argument("--num-prompts", type=int, default=256)
    ap.add_argument("--prefix-len", type=int, default=2048)
    ap.add_argument("--cprofile-steps", type=int, default=3, help="then profile the first N steps' host time")
    ap.add_argument("--trace", help="write the profiled steps' chrome trace (CPU and CUDA) here")
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

    reqs = _requests(vocab, 2, a.num_prompts, a.prefix_len)
    from attnserve.core.sampling_params import SamplingParams

    for r in reqs:
        engine.add_request(
            r.prompt_token_ids,
            SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True, detokenize=False),
        )
    kernels = _profile_steps(engine, a.profile_steps, a.trace)
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
