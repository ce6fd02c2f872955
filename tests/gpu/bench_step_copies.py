"""A decode step's host<->device copies on side streams against in line with the step's kernels, in one process
on one engine: TPOT as ``bench latency`` measures it (``latency.run_engine``), the variants alternated.

``python -m tests.gpu.bench_step_copies [--model benchmarks/shapes/qwen3-0.6b] [--backend TRITON_ATTN]
[--batch-size 1 64] [--input-len 1024] [--output-len 128] [--rounds 2] [--json OUT]`` on a GPU.

Variants: ``side streams`` (the engine as built: the graph inputs' copies on ``CudaGraphRunner.input_stream``,
the sampled tokens' copy to the host on the sampler's side stream) and ``in line`` (both on the current
stream, as before). Correctness of the side streams: ``tests/gpu/test_async_scheduling_gpu.py`` and
``tests/gpu/test_cuda_graphs.py``.
"""

from __future__ import annotations

import argparse
import json

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="benchmarks/shapes/qwen3-0.6b")
    ap.add_argument("--backend", default="TRITON_ATTN")
    ap.add_argument("--batch-size", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--input-len", type=int, default=1024)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args()

    from attnserve import LLM
    from attnserve.benchmarks.latency import run_engine
    from attnserve.benchmarks.roofline import Roofline, kv_bytes_per_token, measure_copy_bandwidth

    device = torch.device("cuda")
    bandwidth = measure_copy_bandwidth(device)
    llm = LLM(args.model, load_format="dummy", dtype="bfloat16", attention_backend=args.backend,
              max_model_len=4096, max_num_seqs=max(args.batch_size), max_num_batched_tokens=65536,
              use_skinny_gemm=True)
    engine = llm.engine
    info = engine.info
    roofline = Roofline(copy_bandwidth=bandwidth, weight_bytes=info.weight_bytes,
                        kv_bytes_per_token=kv_bytes_per_token(info.num_layers, info.num_kv_heads, info.head_size,
                                                              info.kv_dtype))
    runner = engine.runner
    graphs, sampler = runner.cuda_graphs, runner.sampler
    side_input_stream = graphs.input_stream

    def use(side: bool) -> None:
        graphs.input_stream = side_input_stream if side else None
        if side:
            sampler.__dict__.pop("_host_copy_stream", None)
        else:
            sampler._host_copy_stream = lambda dev: torch.cuda.current_stream(dev)

    vocab = runner.dims.vocab_size
    rows = []
    for r in range(args.rounds):
        for name, side in (("side streams", True), ("in line", False)):
            use(side)
            for b in args.batch_size:
                row = run_engine(engine, b, args.input_len, args.output_len, 2, 1, vocab, 0, roofline)
                d = row.to_dict()
                rows.append({"variant": name, "round": r, "batch_size": b, "tpot_ms": d["tpot_s"]["mean"] * 1e3,
                             "pct_of_limit": d["roofline"]["pct_of_limit"]})
                print(f"{name:13s} b{b:<3d} TPOT {rows[-1]['tpot_ms']:.4f} ms  "
                      f"{rows[-1]['pct_of_limit']:.1f}% of limit", flush=True)
    use(True)
    out = {"model": args.model, "backend": args.backend, "copy_bandwidth": bandwidth,
           "gpu": torch.cuda.get_device_name(), "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
