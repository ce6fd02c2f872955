"""Whether the GPU waits for the host between decode steps: the engine's own loop (``engine.step()`` as
``bench latency`` drives it) under the profiler, and the GPU timeline of its decode steps.

``python -m benchmarks.gpu.profile_engine_steps [--model benchmarks/shapes/qwen3-0.6b] [--backend FLASH_ATTN]
[--batch-size 64] [--input-len 1024] [--output-len 48] [--use-skinny-gemm] [--json OUT]`` on a GPU.

One batch runs unprofiled first (compiles, captures); the second is profiled. Its kernels after the last
prefill kernel are the decode steps: their busy time (sum of kernel durations), span (first start to last
end) and the idle time between kernels, split into gaps inside a step (< ``--step-gap-us``) and gaps
between steps, with the largest gaps listed. Idle time between steps is host time the GPU waited for
(async scheduling should hide it); time per step = span / decode steps. A batch of ``--output-len`` tokens
per request runs ``output_len - 1`` decode steps (the first token comes from the prefill); ``engine.step()``
is called more often than that (the prefill, and async scheduling's last call), so the per-step figures
divide by the decode steps, not the calls (sessions 8-9 divided
by the calls: 49 for 47 decode steps, 4% low).
"""

from __future__ import annotations

import argparse
import json

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="benchmarks/shapes/qwen3-0.6b")
    ap.add_argument("--backend", default="FLASH_ATTN")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=1024)
    ap.add_argument("--output-len", type=int, default=48)
    ap.add_argument("--use-skinny-gemm", action="store_true")
    ap.add_argument("--step-gap-us", type=float, default=20.0)
    ap.add_argument(
        "--no-enable-pdl",
        dest="enable_pdl",
        action="store_false",
        help="launch without programmatic dependent launch (kernel times then do not include the "
        "time a PDL-launched kernel spends waiting for its predecessor)",
    )
    ap.add_argument("--json")
    args = ap.parse_args()

    from torch.profiler import ProfilerActivity, profile

    from attnserve import LLM
    from attnserve.benchmarks.latency import iteration_requests
    from attnserve.engine.sampling_params import SamplingParams

    llm = LLM(
        args.model,
        load_format="dummy",
        dtype="bfloat16",
        attention_backend=args.backend,
        max_model_len=4096,
        max_num_seqs=args.batch_size,
        max_num_batched_tokens=65536,
        use_skinny_gemm=args.use_skinny_gemm,
        enable_pdl=args.enable_pdl,
    )
    engine = llm.engine
    vocab = engine.runner.dims.vocab_size
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True, detokenize=False)

    def batch(it: int) -> int:
        for r in iteration_requests(args.batch_size, args.input_len, args.output_len, vocab, 0, it):
            engine.add_request(r.prompt_token_ids, params)
        steps = 0
        while engine.has_unfinished_requests():
            engine.step()
            steps += 1
        return steps

    batch(0)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        steps = batch(1)
        torch.cuda.synchronize()
    cuda_events = sorted(
        (e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA), key=lambda e: e.time_range.start
    )
    kernels = [e for e in cuda_events if "Memcpy" not in e.name and "Memset" not in e.name]
    # every decode step starts with one embedding lookup (F.embedding: a gather kernel, or index_select's at one
    # row), and a batch of --output-len tokens runs output_len - 1 decode steps: they start at the
    # (output_len - 1)-th lookup from the end (the prefill may have more than one: its last-token selection);
    # with fewer lookups than that, after the prefill's last long kernel (over 200 us, not a GEMM)
    n = max(args.output_len - 1, 1)  # decode steps
    gathers = [i for i, e in enumerate(kernels) if "gather" in e.name or "indexSelect" in e.name]
    if len(gathers) > n:
        first = gathers[-n]
    else:
        first = max((i for i, e in enumerate(kernels) if e.device_time > 200 and "nvjet" not in e.name), default=-1) + 1
    decode = kernels[first:]
    gaps = [(b.time_range.start - a.time_range.end, a.name[:60], b.name[:60]) for a, b in zip(decode, decode[1:])]
    inside = sum(g for g, *_ in gaps if 0 < g < args.step_gap_us)
    between = [g for g in gaps if g[0] >= args.step_gap_us]
    busy = sum(e.device_time for e in decode)
    start = decode[0].time_range.start if decode else 0.0
    copies = [e for e in cuda_events if "Memcpy" in e.name and e.time_range.start >= start]

    def copies_in(t0: float, t1: float) -> int:  # copies that overlap [t0, t1]
        return sum(1 for e in copies if e.time_range.start < t1 and e.time_range.end > t0)

    gap_spans = [
        (b.time_range.start - a.time_range.end, a.time_range.end, b.time_range.start, a.name[:60], b.name[:60])
        for a, b in zip(decode, decode[1:])
    ]
    span = decode[-1].time_range.end - decode[0].time_range.start if decode else 0.0
    result = {
        "model": args.model,
        "backend": args.backend,
        "batch_size": args.batch_size,
        "engine_steps": steps,
        "decode_steps": n,
        "ms_per_decode_step": span / 1e3 / n,
        "busy_ms_per_decode_step": busy / 1e3 / n,
        "decode_kernels": len(decode),
        "busy_ms": busy / 1e3,
        "span_ms": span / 1e3,
        "idle_inside_steps_ms": inside / 1e3,
        "idle_between_steps_ms": sum(g for g, *_ in between) / 1e3,
        "gaps_over_threshold": len(between),
        "largest_gaps_us": [(round(g, 1), a, b) for g, a, b in sorted(between, reverse=True)[:12]],
        # the host<->device copies of the decode steps, and how many of them fall in the gaps between steps
        "copies_per_step": len(copies) / n,
        "copy_us_per_step": sum(e.device_time for e in copies) / n,
        "copies_in_gaps_between_steps": sum(copies_in(t0, t1) for g, t0, t1, *_ in gap_spans if g >= args.step_gap_us),
        "copy_names": sorted({e.name for e in copies}),
        # per kernel name: launches and GPU time per step, and the idle time before it per step (where the
        # GPU waits: after which kind of kernel the next one is slow to start)
        "by_kernel": _by_kernel(decode, n),
    }
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


def _by_kernel(decode: list, steps: int, top: int = 25) -> list[dict]:
    """The ``top`` kernel names by GPU time + idle before them, per step (us)."""
    rows: dict[str, dict] = {}
    prev_end = None
    for e in decode:
        r = rows.setdefault(
            e.name[:70], {"kernel": e.name[:70], "per_step": 0.0, "us_per_step": 0.0, "idle_before_us_per_step": 0.0}
        )
        r["per_step"] += 1 / steps
        r["us_per_step"] += e.device_time / steps
        if prev_end is not None:
            r["idle_before_us_per_step"] += max(0.0, e.time_range.start - prev_end) / steps
        prev_end = e.time_range.end
    out = sorted(rows.values(), key=lambda r: -(r["us_per_step"] + r["idle_before_us_per_step"]))[:top]
    return [{k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()} for r in out]


if __name__ == "__main__":
    main()
