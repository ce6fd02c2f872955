"""Whether the GPU waits for the host between decode steps: the engine's own loop (``engine.step()`` as
``bench latency`` drives it) under the profiler, and the GPU timeline of its decode steps.

``python -m tests.gpu.profile_engine_steps [--model benchmarks/shapes/qwen3-0.6b] [--backend FLASH_ATTN]
[--batch-size 64] [--input-len 1024] [--output-len 48] [--use-skinny-gemm] [--json OUT]`` on a GPU.

One batch runs unprofiled first (compiles, captures); the second is profiled. Its kernels after the last
prefill kernel are the decode steps: their busy time (sum of kernel durations), span (first start to last
end) and the idle time between kernels, split into gaps inside a step (< ``--step-gap-us``) and gaps
between steps, with the largest gaps listed. Idle time between steps is host time the GPU waited for
(async scheduling should hide it); time per step = span / decode steps.
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
    ap.add_argument("--json")
    args = ap.parse_args()

    from torch.profiler import ProfilerActivity, profile

    from attnserve import LLM
    from attnserve.benchmarks.latency import iteration_requests
    from attnserve.engine.sampling_params import SamplingParams

    llm = LLM(args.model, load_format="dummy", dtype="bfloat16", attention_backend=args.backend,
              max_model_len=4096, max_num_seqs=args.batch_size, max_num_batched_tokens=65536,
              use_skinny_gemm=args.use_skinny_gemm)
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
    kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                      and "Memcpy" not in e.name), key=lambda e: e.time_range.start)
    # the decode steps start after the prefill's last long kernel: the last kernel over 200 us
    first = max((i for i, e in enumerate(kernels) if e.device_time > 200 and "nvjet" not in e.name), default=-1) + 1
    decode = kernels[first:]
    gaps = [(b.time_range.start - a.time_range.end, a.name[:60], b.name[:60]) for a, b in zip(decode, decode[1:])]
    inside = sum(g for g, *_ in gaps if 0 < g < args.step_gap_us)
    between = [g for g in gaps if g[0] >= args.step_gap_us]
    busy = sum(e.device_time for e in decode)
    span = decode[-1].time_range.end - decode[0].time_range.start if decode else 0.0
    result = {"model": args.model, "backend": args.backend, "batch_size": args.batch_size,
              "engine_steps": steps, "decode_kernels": len(decode), "busy_ms": busy / 1e3, "span_ms": span / 1e3,
              "idle_inside_steps_ms": inside / 1e3, "idle_between_steps_ms": sum(g for g, *_ in between) / 1e3,
              "gaps_over_threshold": len(between),
              "largest_gaps_us": [(round(g, 1), a, b) for g, a, b in sorted(between, reverse=True)[:12]]}
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
