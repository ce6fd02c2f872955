"""The decode kernels of issue 26 under Nsight Compute: TRITON_ATTN's bf16 decode (``paged_attention``) and the
keys-major fp8 decode (``fp8_decode_attention``, its defaults), each launched ``--calls`` times eagerly on
``bench_fp8_decode``'s step (batch 64 x 8,192, GQA 32/8, head 128, page 16).

    ncu -k regex:"_fp8_decode_kernel|attention_kernel" --launch-skip 2 --launch-count 2 --section ... \
        python -m benchmarks.gpu.ncu_fp8_decode

Prints each kernel's CUDA-event time (median) too, so the run means something without ncu.
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
        for name, run, kv in (("bf16", runner(step, kv16), kv16), ("e4m3 keys-major", keys_major_runner(step), kv8)):
            times = []
            for _ in range(args.calls):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                run(kv)
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end) * 1e3)
            print(f"{name}: median {statistics.median(times):.1f} us over {args.calls} eager calls", flush=True)


if __name__ == "__main__":
    main()
