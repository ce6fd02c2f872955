"""How close is TRITON_ATTN's batch decode to what HBM can give, and does its last wave cost?

Two ceilings are measured first: the copy bandwidth the roofline uses (``roofline.measure_copy_bandwidth``:
read + write of a large copy) and the read-only bandwidth of a reduction (``torch.sum`` of 2 GB and a Triton
kernel that sums 16-byte loads per program; attention reads KV and writes almost nothing, so read-only is
its own ceiling). Then the Qwen3-0.6B decode call (16 query / 8 KV heads, head 128, pages of 16, 64-token
KV tiles) at context ``--context`` for several batch sizes: a decode call launches ``batch x 8`` programs
and an H200 runs 3 of them per SM (396 at once), so batch 48 fits one wave, 64 is 1.29 waves (the last
wave 29% full), 99 two full waves. KV TB/s per batch says what the partial wave costs. Each time is
``gemv.timing.time_per_call_us`` over cache copies larger than twice the L2 (``bench_triton_decode``'s way).

``python -m benchmarks.gpu.bench_decode_waves [--context 1024] [--batches 32 48 64 96 99 128] [--json OUT]``.
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl


@triton.jit
def _sum_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    pid = tl.program_id(0)
    base = pid.to(tl.int64) * BLOCK * ITERS
    acc = tl.zeros([BLOCK], tl.float32)
    for i in range(ITERS):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc, 0))


def read_bandwidth(nbytes: int = 2 << 30) -> dict:
    """Bytes per second read by ``torch.sum`` and by ``_sum_kernel`` (fastest of 10 after a warm-up)."""
    x = torch.randn(nbytes // 2, device="cuda", dtype=torch.bfloat16)
    out = {}
    block, iters = 2048, 8
    partial = torch.empty(triton.cdiv(x.numel(), block * iters), device="cuda", dtype=torch.float32)
    for name, fn in {
        "torch_sum": lambda: x.sum(dtype=torch.float32),
        "triton_sum": lambda: _sum_kernel[(partial.numel(),)](
            x, partial, x.numel(), BLOCK=block, ITERS=iters, num_warps=8
        ),
    }.items():
        fn()
        times = []
        for _ in range(10):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) / 1e3)
        out[name] = nbytes / min(times)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--batches", type=int, nargs="+", default=[32, 48, 64, 96, 99, 128])
    ap.add_argument("--splits", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--json")
    args = ap.parse_args()
    from attnserve.kernels.kv_write import kv_views
    from attnserve.kernels.triton_attention import paged_attention
    from attnserve.benchmarks.roofline import measure_copy_bandwidth
    from attnserve.gemv import timing as gemv_timing
    from benchmarks.gpu.bench_triton_decode import make_step

    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    l2 = gemv_timing.l2_bytes(dev)
    result = {
        "device": props.name,
        "copy_Bps": measure_copy_bandwidth(dev),
        **{f"{k}_Bps": v for k, v in read_bandwidth().items()},
    }
    print({k: (round(v / 1e12, 3) if k.endswith("Bps") else v) for k, v in result.items()}, flush=True)
    rows = []
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for batch in args.batches:
            step = make_step(batch, 16, 8, args.context, 16, 4096, 4096, props.multi_processor_count, dev, gen)
            md, call, query = step["metadata"], step["call"], step["query"]
            cache_bytes = 2 * step["num_blocks"] * 16 * 8 * 128 * 2
            copies = [
                torch.randn(step["cache_shape"], generator=gen).to(dev, torch.bfloat16)
                for _ in range(max(1, -(-2 * l2 // cache_bytes)))
            ]
            out = torch.empty_like(query)
            kv_bytes = 2 * batch * args.context * 8 * 128 * 2
            for splits in args.splits:

                def run(kv, splits=splits):
                    k, v = kv_views(kv, 1)
                    paged_attention(
                        out,
                        query,
                        k,
                        v,
                        md.block_table,
                        md.seq_lens,
                        md.query_start_loc,
                        call.tile_seq,
                        call.tile_start,
                        128**-0.5,
                        num_splits=splits,
                        split_token_range=call.token_range,
                        launch=call.launch if splits == call.num_splits else {"num_stages": 2},
                        decode=call.decode,
                    )

                us = gemv_timing.time_per_call_us(run, copies, 40, 10)
                row = {
                    "batch": batch,
                    "splits": splits,
                    "builder_splits": call.num_splits,
                    "programs": batch * 8 * splits,
                    "us": round(us, 2),
                    "kv_TBps": round(kv_bytes / us / 1e6, 3),
                    "pct_copy": round(100 * kv_bytes / us / 1e-6 / result["copy_Bps"], 1),
                    "pct_read": round(100 * kv_bytes / us / 1e-6 / result["triton_sum_Bps"], 1),
                }
                rows.append(row)
                print(row, flush=True)
            del copies
            torch.cuda.empty_cache()
    result["rows"] = rows
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
