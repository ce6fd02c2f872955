"""The keys-major fp8 decode (``kernels/triton_fp8_decode.py``) against TRITON_ATTN's unified kernel, bf16 and
fp8, in one process: its PV conversions, KV tiles, warps, pipeline stages, splits, query rows and timing
probes.

``python -m benchmarks.gpu.bench_fp8_keys_major [--json OUT] [--block-size 16] [--batch 64] [--context 8192]``
on a GPU. The shape, data, reference check and timing are ``bench_fp8_decode``'s (default: batch 64 x
8,192-token contexts, GQA 32/8, head 128, N(0, 2^2) K/V stored as fp8 with scales 10/448 and 12/448,
CUDA-graph replays, median). Rows: ``bf16`` and ``e4m3/e5m2 unified`` are ``paged_attention`` with the
builder's plan (what TRITON_ATTN ran before the keys-major kernel); ``keys`` rows the keys-major kernel, its
defaults first. ``x bf16``: the bf16 row's time over the row's. A probe row leaves part of the loop out
(``triton_fp8_decode.PROBES``): its output is marked WRONG by design, its time is the point.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from benchmarks.gpu.bench_fp8_decode import (
    FP8,
    HEAD,
    K_SCALE,
    V_SCALE,
    build_step,
    fp8_cache,
    reference,
    runner,
    step_args,
)

KEYS = ("pv", "block_n", "q_rows", "splits", "probe", "launch")


def fp8_runner(step: dict, attention):
    """``run(kv, **config)``: one call of the step to ``attention``, a decode over an fp8 cache with
    ``fp8_decode_attention``'s arguments (out, query, key and value caches, block table, lengths, scale, k/v scales)."""
    from attnserve.kernels.kv_write import kv_views

    md, query = step["metadata"], step["query"]
    out = torch.empty_like(query)

    def run(kv, **config):
        key_cache, value_cache = kv_views(kv, 1)
        return attention(
            out,
            query,
            key_cache,
            value_cache,
            md.block_table,
            md.seq_lens,
            HEAD**-0.5,
            k_scale=K_SCALE,
            v_scale=V_SCALE,
            **config,
        )

    return run


def keys_major_runner(step: dict):
    """``run(kv, splits=1, **config)``: one ``fp8_decode_attention`` call of the step."""
    from attnserve.kernels.triton_fp8_decode import fp8_decode_attention

    run = fp8_runner(step, fp8_decode_attention)
    return lambda kv, splits=1, **config: run(kv, num_splits=splits, **config)


def configs(args, planned_splits: int) -> list[dict]:
    """The kernel's defaults with the builder's split count, then the grid: PV x tiles x warps x stages x splits
    x query rows x probes."""
    grid = [
        dict(pv=pv, block_n=bn, launch=dict(num_warps=w, num_stages=st), splits=sp, q_rows=qr, probe=probe)
        for pv in args.pv
        for bn in args.tokens
        for w in args.warps
        for st in args.stages
        for sp in args.splits
        for qr in args.q_rows
        for probe in args.probes
    ]
    return [dict(splits=planned_splits)] + grid


def tag(r: dict, keys: tuple[str, ...] = KEYS) -> str:
    return " ".join(f"{k}={r[k]}" for k in keys if r.get(k) not in (None, ""))


def main() -> None:
    from attnserve.kernels.triton_fp8_decode import PROBES, PV_MODES
    from benchmarks.gpu.bench_fp8_decode import graph_median_us, measure, show
    from tests.gpu.cases import TOLERANCE

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json")
    step_args(ap)
    ap.add_argument("--pv", nargs="+", choices=PV_MODES, default=["f16", "f16v"])
    ap.add_argument("--tokens", type=int, nargs="+", default=[64, 128], help="KV tile sizes")
    ap.add_argument("--warps", type=int, nargs="+", default=[4])
    ap.add_argument("--stages", type=int, nargs="+", default=[2, 3])
    ap.add_argument("--splits", type=int, nargs="+", default=[1])
    ap.add_argument("--q-rows", type=int, nargs="+", default=[8])
    ap.add_argument("--probes", nargs="+", choices=PROBES, default=[""])
    ap.add_argument("--budget", type=float, default=150.0)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--replays", type=int, default=10)
    args = ap.parse_args()
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    t0 = time.perf_counter()
    tol = TOLERANCE["fp8"]
    with torch.no_grad():
        step = build_step(args, dev, props.multi_processor_count)
        elems = 2 * args.batch * args.context * args.kv_heads * HEAD
        kv16 = step["cache"].to(torch.bfloat16)
        ref = reference(step, kv16)
        bf16 = measure(
            "bf16", runner(step, kv16), kv16, ref, args, graph_median_us, 2 * elems, TOLERANCE[torch.bfloat16]
        )
        rows, bf16_us = [bf16], bf16.get("us")
        print(show(bf16, bf16_us), flush=True)
        del kv16, ref
        for fmt in ("e4m3", "e5m2"):
            kv = fp8_cache(step["cache"], FP8[fmt])
            ref = reference(step, kv)
            rows.append(measure(f"{fmt} unified", runner(step, kv), kv, ref, args, graph_median_us, elems, tol))
            print(show(rows[-1], bf16_us), flush=True)
            todo = configs(args, step["calls"][True].num_splits)
            for cfg in todo if fmt == "e4m3" else todo[:1]:
                if time.perf_counter() - t0 > args.budget:
                    print("== budget spent", flush=True)
                    break
                row = measure(f"{fmt} keys", keys_major_runner(step), kv, ref, args, graph_median_us, elems, tol, **cfg)
                rows.append(row)
                print(show(row, bf16_us), tag(row), flush=True)
            del kv, ref
    ok = sorted([r for r in rows if "us" in r and r.get("ok")], key=lambda r: r["us"])
    print(
        f"\n== {time.perf_counter() - t0:.0f} s, block {args.block_size}, batch {args.batch} x {args.context}; fastest:"
    )
    for r in ok[:8]:
        print(show(r, bf16_us), tag(r))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=props.name, args=vars(args), bf16_us=bf16_us, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
