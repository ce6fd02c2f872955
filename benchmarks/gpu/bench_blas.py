"""cuBLAS against cuBLASLt (``torch.backends.cuda.preferred_blas_library``) on a decode step's matmuls, in one
process: per shape, a CUDA graph of one matmul per layer, each layer its own weight (so the weights stream from
HBM, not L2, as in a real step), microseconds per matmul; then the layer's four matmuls chained, per layer.

``python -m benchmarks.gpu.bench_blas [--json OUT]`` on a GPU. Shapes: Qwen3-0.6B at 64 rows (28 layers), Llama-3.1-8B
at 1 row (32 layers); ``F.linear`` as the engine calls it, bf16.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

# (name, rows, layers, [(N, K) of qkv, o, gate_up, down])
CASES = [
    ("qwen3_b64", 64, 28, [(4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072)]),
    ("qwen3_b1", 1, 28, [(4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072)]),
    ("llama_b1", 1, 32, [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]),
    ("llama_b64", 64, 32, [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]),
]
NAMES = ["qkv", "o", "gate_up", "down"]


def time_graph(fn, iters: int = 20) -> float:
    """Milliseconds per replay of ``fn`` captured in a CUDA graph (median of ``iters``)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(3):
        g.replay()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", nargs="+", default=[c[0] for c in CASES])
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.manual_seed(0)
    rows = []
    for name, m, layers, shapes in CASES:
        if name not in args.cases:
            continue
        ws = [
            [torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02 for (n, k) in shapes] for _ in range(layers)
        ]
        xs = [torch.randn(m, k, dtype=torch.bfloat16, device="cuda") for (_, k) in shapes]
        for lib in ("cublas", "cublaslt", "cublas"):
            torch.backends.cuda.preferred_blas_library(lib)
            torch.cuda.synchronize()
            row = {"case": name, "rows": m, "library": lib}
            for i, shape_name in enumerate(NAMES):
                ms = time_graph(lambda i=i, xs=xs, ws=ws: [F.linear(xs[i], ws[j][i]) for j in range(layers)])
                row[f"{shape_name}_us"] = ms * 1e3 / layers
            row["layer_sum_us"] = sum(row[f"{s}_us"] for s in NAMES)
            ms = time_graph(lambda xs=xs, ws=ws: [F.linear(xs[i], ws[j][i]) for j in range(layers) for i in range(4)])
            row["chain_us_per_layer"] = ms * 1e3 / layers
            rows.append(row)
            print(
                f"{name:10s} {lib:9s} "
                + " ".join(f"{s} {row[f'{s}_us']:6.2f}" for s in NAMES)
                + f"  sum {row['layer_sum_us']:6.2f}  chain {row['chain_us_per_layer']:6.2f} us/layer",
                flush=True,
            )
        del ws, xs
        torch.cuda.empty_cache()
    torch.backends.cuda.preferred_blas_library("cublas")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
