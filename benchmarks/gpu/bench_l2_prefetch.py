"""Does prefetching a linear layer's weight into L2 while a latency-bound kernel runs make the layer faster?

At batch 1 a decode step's attention reads a few MB of KV in ~10 us (Llama-3.1-8B, 1k context: FA3 9.8 us +
2.7 us combine per layer), while HBM sits mostly idle; the o_proj right after it then streams 33.5 MB from
HBM (~12.6 us with cuBLAS). This measures the premise of overlapping the two, per "layer" of a CUDA graph:

- ``plain``: ``torch.cuda._sleep`` (a kernel that spins for ``--busy-us`` without touching memory, standing
  in for attention), then ``F.linear(x, w_i)``;
- ``prefetch``: the same, with a side stream that asks L2 to prefetch ``w_i`` (``prefetch.global.L2`` on
  each 128-byte line) while the busy kernel runs; the linear layer waits for both;
- ``linear``: ``F.linear`` alone (no busy kernel), for reference.

Each layer has its own weight (32 of them, 1 GB at the Llama o_proj shape: L2 holds none between layers).
``python -m benchmarks.gpu.bench_l2_prefetch [--n 4096] [--k 4096] [--busy-us 12] [--json OUT]``.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from benchmarks.gpu.bench_decode_graph import time_graph


@triton.jit
def _prefetch_kernel(ptr, n_lines, LINE_ELEMS: tl.constexpr, LINES: tl.constexpr):
    offs = tl.program_id(0) * LINES + tl.arange(0, LINES)
    ptrs = ptr + tl.minimum(offs, n_lines - 1).to(tl.int64) * LINE_ELEMS
    tl.inline_asm_elementwise(
        "prefetch.global.L2::evict_last [$1]; // $0 unused", "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1
    )


def prefetch_l2(t: torch.Tensor, lines_per_program: int = 1024) -> None:
    n_lines = t.numel() * t.element_size() // 128
    _prefetch_kernel[(triton.cdiv(n_lines, lines_per_program),)](
        t, n_lines, LINE_ELEMS=128 // t.element_size(), LINES=lines_per_program, num_warps=4
    )


def time_graph_us(fn, layers: int) -> float:
    """Microseconds per layer of one CUDA-graph replay of ``fn`` (``bench_decode_graph.time_graph``)."""
    return time_graph(fn, iters=50) * 1000 / layers


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--busy-us", type=float, nargs="+", default=[6.0, 12.0])
    ap.add_argument("--json")
    args = ap.parse_args()
    dev = torch.device("cuda")
    ws = [torch.randn(args.n, args.k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(args.layers)]
    x = torch.randn(1, args.k, device=dev, dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    # cycles per microsecond for _sleep
    clock_mhz = (
        torch.cuda.get_device_properties(dev).clock_rate / 1000
        if hasattr(torch.cuda.get_device_properties(dev), "clock_rate")
        else 1980.0
    )
    out = {"n": args.n, "k": args.k, "layers": args.layers, "weight_mb": args.n * args.k * 2 / 1e6, "rows": []}

    def linear_only():
        for w in ws:
            F.linear(x, w)

    out["linear_us"] = time_graph_us(linear_only, args.layers)
    for busy in args.busy_us:
        cycles = int(busy * clock_mhz)

        def plain():
            for w in ws:
                torch.cuda._sleep(cycles)
                F.linear(x, w)

        def prefetched():
            main = torch.cuda.current_stream()
            for w in ws:
                side.wait_stream(main)
                with torch.cuda.stream(side):
                    prefetch_l2(w)
                torch.cuda._sleep(cycles)
                main.wait_stream(side)
                F.linear(x, w)

        def busy_only():
            for _ in ws:
                torch.cuda._sleep(cycles)

        row = {
            "busy_us_asked": busy,
            "busy_only_us": time_graph_us(busy_only, args.layers),
            "plain_us": time_graph_us(plain, args.layers),
            "prefetch_us": time_graph_us(prefetched, args.layers),
        }
        row["linear_in_plain_us"] = row["plain_us"] - row["busy_only_us"]
        row["linear_in_prefetch_us"] = row["prefetch_us"] - row["busy_only_us"]
        out["rows"].append(row)
        print(json.dumps(row), flush=True)
    print(f"linear alone {out['linear_us']:.2f} us per layer ({out['weight_mb']:.1f} MB)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
