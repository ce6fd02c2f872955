"""``torch.argmax`` against the sampler's Triton argmax (``kernels/triton_argmax.py``) on decode-step logits,
in one process: microseconds per call in a CUDA graph of 20 calls on 8 rotating logits buffers (so they come
from HBM, not L2), and whether the indices agree.

``python -m benchmarks.gpu.bench_argmax [--json OUT]`` on a GPU.
"""

from __future__ import annotations

import argparse
import json

import torch

CASES = [(1, 151936), (64, 151936), (256, 151936), (1, 128256), (64, 128256)]


def time_us(fn, inputs, calls: int = 20) -> float:
    graph = torch.cuda.CUDAGraph()
    for x in inputs[:2]:
        fn(x)
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(inputs[i % len(inputs)])
    graph.replay()
    times = []
    for _ in range(11):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / calls)
    return sorted(times)[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    from attnserve.kernels.triton_argmax import argmax

    rows = []
    for b, v in CASES:
        xs = [torch.randn(b, v, device="cuda").to(torch.bfloat16) for _ in range(8)]
        torch_us = time_us(lambda x: x.argmax(dim=-1), xs)
        triton_us = time_us(argmax, xs)
        same = all(torch.equal(argmax(x), x.argmax(dim=-1)) for x in xs)
        rows.append({"rows": b, "vocab": v, "torch_us": torch_us, "triton_us": triton_us, "same": same})
        print(f"{b:4d} x {v:6d} bf16: torch {torch_us:6.2f} us  triton {triton_us:6.2f} us  same={same}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
