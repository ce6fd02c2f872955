"""Does splitting a decode batch in two and overlapping one half's attention with the other half's matmuls
make a step faster? (The premise of NanoFlow's nano-batches and of two-batch overlap.)

At batch 64 x 1k context a Qwen3-0.6B layer spends ~70 us in attention, which streams KV at ~90% of the
copy bandwidth, and ~25 us in four cuBLAS GEMMs that stream 31 MB of weights at ~30% of it (latency-bound:
few CTAs, short kernels). If the GEMMs of one half-batch ran while the other half's attention streams KV,
their latency would hide under its bandwidth. This measures that premise on a stand-in for the model's
layers, 28 of them, each with its own weights and KV cache (real kernels, random data):

    rms_norm -> qkv GEMM -> attention (TRITON_ATTN's paged decode) -> o GEMM -> rms_norm(+residual)
             -> gate_up GEMM -> silu_and_mul -> down GEMM

- ``seq64``: the whole batch on one stream, as the engine runs it today;
- ``seq32x2``: two half-batches one after the other on one stream (the cost of the split alone);
- ``overlap``: the halves on two streams, their attentions alternating (A's attention of layer l waits for B's
  of layer l-1, B's waits for A's of layer l), so each half's GEMMs run beside the other half's attention;
- ``free``: the halves on two streams with no edge between them.

Each variant is one CUDA graph; milliseconds per replay (CUDA events, median of ``--rounds`` rounds of
``--iters`` replays, variants alternated). ``python -m benchmarks.gpu.bench_batch_overlap [--batch 64]
[--context 1024] [--layers 28] [--json OUT]`` on a GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.nn.functional as F

from benchmarks.gpu.bench_triton_decode import decode_call

HEAD = 128


class Layer:
    """One stand-in decoder layer's weights and KV cache (``num_blocks`` pages of ``block`` tokens)."""

    def __init__(self, hidden: int, hq: int, hkv: int, inter: int, num_blocks: int, block: int, dev: torch.device):
        def w(n, k):
            return torch.randn(n, k, device=dev, dtype=torch.bfloat16) * k**-0.5

        self.qkv = w((hq + 2 * hkv) * HEAD, hidden)
        self.o = w(hidden, hq * HEAD)
        self.gate_up = w(2 * inter, hidden)
        self.down = w(hidden, inter)
        self.norm1 = torch.ones(hidden, device=dev, dtype=torch.bfloat16)
        self.norm2 = torch.ones(hidden, device=dev, dtype=torch.bfloat16)
        self.kv = torch.randn(num_blocks, 2, block, hkv, HEAD, device=dev, dtype=torch.bfloat16)


def run_layers(layers, half, x: torch.Tensor, hq: int, on_attention=None) -> torch.Tensor:
    """The stand-in forward of ``x`` (rows of ``half``'s requests) through ``layers``; ``on_attention(l, fn)``
    wraps each layer's attention call (the overlap variant's stream edges)."""
    from attnserve.kernels.kv_write import kv_views
    from attnserve.kernels.triton_attention import paged_attention
    from attnserve.kernels.triton_fused_ops import rms_norm, silu_and_mul

    md, call = half
    residual = x
    h = rms_norm(x, layers[0].norm1, 1e-6)
    out = torch.empty(x.shape[0], hq, HEAD, device=x.device, dtype=x.dtype)
    for i, layer in enumerate(layers):
        qkv = F.linear(h, layer.qkv)
        q = qkv[:, : hq * HEAD].view(-1, hq, HEAD)
        k_cache, v_cache = kv_views(layer.kv, 1)

        def attend(q=q, k_cache=k_cache, v_cache=v_cache):
            paged_attention(
                out,
                q,
                k_cache,
                v_cache,
                md.block_table,
                md.seq_lens,
                md.query_start_loc,
                call.tile_seq,
                call.tile_start,
                HEAD**-0.5,
                num_splits=call.num_splits,
                split_token_range=call.token_range,
                launch=call.launch,
                decode=call.decode,
            )

        (on_attention or (lambda _l, fn: fn()))(i, attend)
        h, residual = rms_norm(F.linear(out.view(x.shape[0], -1), layer.o), layer.norm2, 1e-6, residual)
        h = F.linear(silu_and_mul(F.linear(h, layer.gate_up)), layer.down)
        nxt = layers[i + 1].norm1 if i + 1 < len(layers) else layer.norm1
        h, residual = rms_norm(h, nxt, 1e-6, residual)
    return h


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument(
        "--max-seq-len", type=int, default=4096, help="the graph's max_seq_len (the engine's max_model_len)"
    )
    ap.add_argument("--shape", default="1024,16,8,3072", help="hidden,q heads,kv heads,intermediate (Qwen3-0.6B)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    dev = torch.device("cuda")
    hidden, hq, hkv, inter = (int(v) for v in args.shape.split(","))
    b, half_b = args.batch, args.batch // 2
    per_req = -(-args.context // args.block)
    width = -(-args.max_seq_len // args.block)
    gen = torch.Generator().manual_seed(0)
    table = torch.zeros(b, width, dtype=torch.int32)
    table[:, :per_req] = torch.randperm(b * per_req, generator=gen).to(torch.int32).view(b, per_req)
    num_blocks = b * per_req + 1
    steps = {
        name: decode_call(t, args.context, args.block, hq, hkv, args.max_seq_len, None, dev)
        for name, t in (("all", table), ("A", table[:half_b]), ("B", table[half_b:]))
    }
    layers = [Layer(hidden, hq, hkv, inter, num_blocks, args.block, dev) for _ in range(args.layers)]
    x = torch.randn(b, hidden, device=dev, dtype=torch.bfloat16)
    xa, xb = x[:half_b].clone(), x[half_b:].clone()
    side = torch.cuda.Stream()

    def seq64():
        run_layers(layers, steps["all"], x, hq)

    def seq32x2():
        run_layers(layers, steps["A"], xa, hq)
        run_layers(layers, steps["B"], xb, hq)

    def two_streams(alternate: bool):
        def fn():
            main = torch.cuda.current_stream()
            done_a = [torch.cuda.Event() for _ in layers]
            done_b = [torch.cuda.Event() for _ in layers]

            def edge_a(i, attend):
                if alternate and i > 0:
                    main.wait_event(done_b[i - 1])
                attend()
                done_a[i].record(main)

            def edge_b(i, attend):
                if alternate:
                    side.wait_event(done_a[i])
                attend()
                done_b[i].record(side)

            side.wait_stream(main)
            with torch.cuda.stream(side):
                run_layers(layers, steps["B"], xb, hq, edge_b)
            run_layers(layers, steps["A"], xa, hq, edge_a)
            main.wait_stream(side)

        return fn

    variants = {"seq64": seq64, "seq32x2": seq32x2, "overlap": two_streams(True), "free": two_streams(False)}
    graphs = {}
    cap = torch.cuda.Stream()
    with torch.no_grad():
        for name, fn in variants.items():
            cap.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(cap):
                for _ in range(2):
                    fn()
            torch.cuda.current_stream().wait_stream(cap)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fn()
            graphs[name] = g
    times: dict[str, list[float]] = {n: [] for n in graphs}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(args.rounds):
        for name, g in graphs.items():
            g.replay()
            start.record()
            for _ in range(args.iters):
                g.replay()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) / args.iters)
    out = {
        "args": vars(args),
        "device": torch.cuda.get_device_name(dev),
        "splits": {k: v[1].num_splits for k, v in steps.items()},
        "ms": {n: round(statistics.median(t), 4) for n, t in times.items()},
        "all_ms": {n: [round(v, 4) for v in t] for n, t in times.items()},
    }
    for n, ms in out["ms"].items():
        print(f"{n:8s} {ms:.4f} ms per step  (x seq64 {out['ms']['seq64'] / ms:.3f})", flush=True)
    print(f"splits {out['splits']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
