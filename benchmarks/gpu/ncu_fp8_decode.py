"""The decode kernels of issue 26 under Nsight Compute, on ``bench_fp8_decode``'s step (batch 64 x 8,192, GQA
32/8, head 128, page 16), in this order, each launched ``--calls`` times eagerly: TRITON_ATTN's bf16 decode
(``paged_attention``), the keys-major fp8 decode (``fp8_decode_attention``) with its defaults, the same without
V (the ``no_pv`` probe: K's half of the loop), and with 128-token KV tiles.

    ncu -k regex:"_fp8_decode_kernel|attention_kernel" --launch-count 4 --section ... \
        python -m benchmarks.gpu.ncu_fp8_decode --calls 1

(ncu counts launches over every kernel its filter matches: with one call each, launches 1-4 are the four
variants.) Prints each variant's CUDA-event time (median) too, so the run means something without ncu.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from benchmarks.gpu.bench_fp8_decode import FP8, build_step, fp8_cache, runner, step_args
from benchmarks.gpu.bench_fp8_keys_major import keys_major_runner


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    step_args(ap)
    ap.add_argument("--calls", type=int, default=5)
    args = ap.parse_args()
    dev = torch.device("cuda")
    with torch.no_grad():
        step = build_step(args, dev, torch.cuda.get_device_properties(dev).multi_processor_count)
        kv16 = step["cache"].to(torch.bfloat16)
        kv8 = fp8_cache(step["cache"], FP8["e4m3"])
        keys = keys_major_runner(step)
        variants = (
            ("bf16", runner(step, kv16), kv16, {}),
            ("e4m3 keys-major", keys, kv8, {}),
            ("e4m3 keys-major, no V (probe)", keys, kv8, {"probe": "no_pv"}),
            ("e4m3 keys-major, 128-token tiles", keys, kv8, {"block_n": 128}),
        )
        for name, run, kv, config in variants:
            times = []
            for _ in range(args.calls):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                run(kv, **config)
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end) * 1e3)
            print(f"{name}: median {statistics.median(times):.1f} us over {args.calls} eager calls", flush=True)


if __name__ == "__main__":
    main()
