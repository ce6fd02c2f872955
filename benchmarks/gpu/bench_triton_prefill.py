"""TRITON_ATTN's prefill (``triton_attention.paged_attention``) in query tiles of 16 to 128 rows, in one process:
tile rows x warps x stages x KV tile, each against 16-row tiles (the decode tiles) on the same inputs.

``python -m benchmarks.gpu.bench_triton_prefill [--json OUT] [--cases ...] [--budget S]`` on a GPU;
``TRITON_INTERPRET=1 ... --tiny`` checks the script on CPU (short sequences, wall-clock times of one call:
meaningless as timings).

A 16-row tile is 4 query tokens x 4 query heads at GQA 4, so a prefill in such tiles walks the whole KV of a
sequence once per 4 of its tokens; a tile of 64 or 128 rows walks it once per 16 or 32 (``paged_attention(
block_m=...)``, the tiles from ``query_tiles`` of its BLOCK_Q). This chose the builder's prefill tiles
(``triton_attn_plan._PREFILL_ROWS``). Each case is a prefill of fresh sequences (context 0, causal), bf16 (or an e4m3
cache: ``--kv-cache-dtype fp8``), the case's head size, 16-token pages scattered over the cache. Every row's
output is compared with the 16-row tiles' (``max_abs``; that kernel is the one tested against the float32
reference) and, in ``--tiny``, with the reference itself. Timing: ``bench_fp8_decode.graph_median_us`` (CUDA
graph of back-to-back calls, median replay). ``TFLOP/s``: causal attention's 4 * Hq * D * sum L(L+1)/2 over the
time.
"""

from __future__ import annotations

import argparse
import json
import time
import traceback

import torch

# name -> (sequence lengths, query heads, kv heads, head size)
CASES = {
    "llama-8k": ([8192], 32, 8, 128),
    "llama-4x2k": ([2048] * 4, 32, 8, 128),
    "qwen-4x2k": ([2048] * 4, 16, 8, 128),
    # one 16384-token step of the throughput workload's prompts (U[100, 1024], mean 562)
    "qwen-29x562": ([562] * 29, 16, 8, 128),
    "smollm2-4x2k": ([2048] * 4, 9, 3, 64),  # the default model: GQA 3, head 64
    "gemma2-4x2k": ([2048] * 4, 16, 8, 256),  # Gemma-2-9B: head 256
}
TINY = {"tiny-gqa4": ([100, 37], 8, 2, 128), "tiny-gqa2": ([70], 4, 2, 128)}


def build_case(
    lens: list[int], hq: int, hkv: int, head: int, page: int, dev: torch.device, kv_dtype: torch.dtype | None = None
) -> dict:
    """A prefill step of ``lens`` fresh sequences (``bench attention``'s ``make_step``: pages in random order), a
    bf16 cache N(0, 1) holding their K/V (``kv_dtype``: converted to it, e.g. fp8 e4m3), and the queries."""
    from attnserve.benchmarks.attention import make_step

    g = torch.Generator().manual_seed(0)
    common, num_blocks = make_step(lens, lens, page, g, dev)
    cache = torch.randn(num_blocks, 2, page, hkv, head, generator=g).to(dev, torch.bfloat16)
    if kv_dtype is not None:
        cache = cache.to(kv_dtype)
    query = torch.randn(sum(lens), hq, head, generator=g).to(dev, torch.bfloat16)
    return dict(
        table=common.block_table,
        qsl_cpu=common.query_start_loc_cpu,
        qsl=common.query_start_loc,
        seq_lens=common.seq_lens,
        cache=cache,
        query=query,
    )


def runner(case: dict):
    """``run(block_m, launch, pages_per_tile)``: one prefill call with that tile size."""
    from attnserve.kernels.attention_tiles import block_m_for, query_tiles
    from attnserve.kernels.kv_write import kv_views
    from attnserve.kernels.triton_attention import paged_attention

    query, cache = case["query"], case["cache"]
    key_cache, value_cache = kv_views(cache, 1)
    out = torch.empty_like(query)
    qpkv = query.shape[1] // key_cache.shape[2]
    tiles = {}

    def run(block_m=16, launch=None, pages_per_tile=None):
        if block_m not in tiles:
            seq, start = query_tiles(case["qsl_cpu"], block_m_for(qpkv, block_m)[1])
            tiles[block_m] = (seq.to(query.device), start.to(query.device))
        return paged_attention(
            out,
            query,
            key_cache,
            value_cache,
            case["table"],
            case["seq_lens"],
            case["qsl"],
            *tiles[block_m],
            query.shape[-1] ** -0.5,
            pages_per_tile=pages_per_tile,
            launch=launch,
            block_m=block_m,
        )

    return run


def configs(args) -> list[dict]:
    """16-row tiles first, then the grid."""
    grid = [
        dict(block_m=bm, launch=dict(num_warps=w, num_stages=st), pages_per_tile=ppt)
        for bm in args.block_m
        for w in args.warps
        for st in args.stages
        for ppt in args.pages_per_tile
    ]
    return [dict(block_m=16)] + grid


def main() -> None:
    from benchmarks.gpu.bench_fp8_decode import _wall_us, graph_median_us

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json")
    ap.add_argument("--cases", nargs="+", default=list(CASES))
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--block-m", type=int, nargs="+", default=[32, 64, 128], help="query rows of a tile")
    ap.add_argument("--warps", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--stages", type=int, nargs="+", default=[2, 3])
    ap.add_argument("--pages-per-tile", type=int, nargs="+", default=[4], help="KV tile in pages (4: 64 tokens)")
    ap.add_argument("--budget", type=float, default=200.0)
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--replays", type=int, default=5)
    ap.add_argument("--kv-cache-dtype", choices=["auto", "fp8"], default="auto", help="fp8: an e4m3 cache")
    ap.add_argument("--tiny", action="store_true", help="check this script on CPU (TRITON_INTERPRET=1)")
    args = ap.parse_args()
    import triton

    cases, time_us = CASES, graph_median_us
    if args.tiny:
        assert triton.knobs.runtime.interpret, "--tiny runs the kernels in the interpreter: TRITON_INTERPRET=1"
        from tests.kernels.triton_attention_interpreted import fix_interpreter_bf16_dot

        fix_interpreter_bf16_dot()
        dev, cases, time_us, args.cases = torch.device("cpu"), TINY, _wall_us, list(TINY)
    else:
        dev = torch.device("cuda")
    t0 = time.perf_counter()
    rows, stopped = [], None
    with torch.no_grad():
        for name in args.cases:
            lens, hq, hkv, head = cases[name]
            kv_dtype = torch.float8_e4m3fn if args.kv_cache_dtype == "fp8" else None
            case = build_case(lens, hq, hkv, head, args.block_size, dev, kv_dtype)
            run = runner(case)
            flops = 4 * hq * head * sum(n * (n + 1) // 2 for n in lens)
            base = run().float().clone()
            ref_err = None
            if args.tiny:
                from attnserve.kernels.reference import reference_paged_attention

                kv = case["cache"].float().permute(1, 0, 2, 3, 4)
                ref = reference_paged_attention(
                    case["query"].float(), kv, case["qsl"], case["seq_lens"], case["table"], head**-0.5
                )
                ref_err = float((base - ref).abs().max() / ref.abs().max())
            for cfg in configs(args):
                if time.perf_counter() - t0 > args.budget:
                    stopped = f"budget of {args.budget:.0f} s spent"
                    break
                row = dict(case=name, **cfg)
                try:
                    out = run(**cfg).float()
                    row["max_abs_vs_16"] = float((out - base).abs().max())
                    row["ref_rel"] = ref_err
                    row["us"] = round(time_us(lambda _: run(**cfg), [None], args.calls, args.replays), 2)
                    row["tflops"] = round(flops / row["us"] / 1e6, 1)
                    print(
                        f"{name:<12} block_m {cfg['block_m']:>3} {cfg.get('launch') or {}} ppt {cfg.get('pages_per_tile')}"
                        f"  {row['us']:10.1f} us {row['tflops']:7.1f} TFLOP/s  max_abs vs 16 rows "
                        f"{row['max_abs_vs_16']:.2e}",
                        flush=True,
                    )
                except Exception as e:  # noqa: BLE001 - a config that does not compile or launch is a row with its error
                    row["error"] = f"{type(e).__name__}: {e}"[:600]
                    print(f"{name} {cfg}: ERROR {row['error']}\n{traceback.format_exc()[-1200:]}", flush=True)
                rows.append(row)
            if stopped:
                print(f"== {stopped}", flush=True)
                break
    print(f"\n== {time.perf_counter() - t0:.0f} s; fastest per case:")
    for name in args.cases:
        timed = sorted([r for r in rows if r["case"] == name and "us" in r], key=lambda r: r["us"])
        base16 = next((r for r in timed if r["block_m"] == 16 and "launch" not in r), None)
        for r in timed[:3]:
            ratio = f"{base16['us'] / r['us']:.2f}x 16-row tiles" if base16 else ""
            print(
                f"{name:<12} block_m {r['block_m']:>3} {r.get('launch')} {r['us']:10.1f} us {r['tflops']:7.1f} TFLOP/s {ratio}"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(args=vars(args), rows=rows, stopped=stopped), f, indent=1)


if __name__ == "__main__":
    main()
