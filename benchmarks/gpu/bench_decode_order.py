"""TRITON_ATTN's decode over contexts of different lengths, as the nano-vllm throughput workload's decode steps
have them: does the order of the requests' programs matter?

``python -m benchmarks.gpu.bench_decode_order [--batch 256] [--q-heads 16] [--kv-heads 8] [--block-size 16]
[--seeds 3] [--json OUT]`` on a GPU.

A step's contexts are drawn as that workload's mid-run state: prompt U[100, 1024] plus the part of an output of
U[100, 1024] tokens already generated (uniform), per request. The kernel is ``paged_attention`` with the tiles of
TRITON_ATTN's builder (its split count for this batch); programs run tile by tile for one KV head, then the
next head, so the tile order is the order the GPU starts them in. Rows, on the same cache and contexts:
``request order`` (the step's, as the engine's decode call takes it), ``longest first`` (the tiles sorted by
context, descending, each KV head's programs in turn), ``ordered`` (``paged_attention(ordered=True)``: longest first,
a request's KV heads together: the long programs do not form the tail), ``shortest first``, and ``uniform`` (every request at the mean context: the same KV bytes
without the spread). Timing as ``bench_triton_decode.py`` (a CUDA graph of calls over cache copies exceeding
twice the L2); each row's output is checked against ``reference_paged_attention``.
"""

from __future__ import annotations

import argparse
import json

import torch

HEAD = 128


def contexts(batch: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(100, 1025, (batch,), generator=g)
    output = torch.randint(100, 1025, (batch,), generator=g)
    done = (torch.rand(batch, generator=g) * output).long()
    return (prompt + done).tolist()


def step_metadata(lens: list[int], block: int, hq: int, hkv: int, dev: torch.device, gen: torch.Generator):
    """TRITON_ATTN's builder's one decode call for requests of context ``lens`` (pages a random permutation); the
    metadata, the call and the cache's block count."""
    from benchmarks.gpu.bench_triton_decode import decode_call

    per = [-(-n // block) for n in lens]
    perm = torch.randperm(sum(per), generator=gen).to(torch.int32)
    table = torch.zeros(len(lens), max(per), dtype=torch.int32)
    at = 0
    for i, n in enumerate(per):
        table[i, :n] = perm[at : at + n]
        at += n
    metadata, call = decode_call(table, lens, block, hq, hkv, max(lens), None, dev)
    return metadata, call, sum(per) + 1


def main() -> None:
    from attnserve.attention.backends.triton_attn import TritonAttentionBackend
    from attnserve.gemv import timing
    from attnserve.kernels.kv_write import kv_views
    from attnserve.kernels.triton_attention import paged_attention
    from benchmarks.gpu.bench_triton_decode import step_reference
    from tests.gpu.cases import TOLERANCE

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--q-heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    dev = torch.device("cuda")
    l2 = timing.l2_bytes(dev)
    rows = []
    for seed in range(a.seeds):
        lens = contexts(a.batch, seed)
        mean = round(sum(lens) / len(lens))
        for label, order_lens in (("request order", lens), ("uniform", [mean] * a.batch)):
            gen = torch.Generator().manual_seed(seed)
            md, call, num_blocks = step_metadata(order_lens, a.block_size, a.q_heads, a.kv_heads, dev, gen)
            shape = TritonAttentionBackend.get_kv_cache_shape(num_blocks, a.block_size, a.kv_heads, HEAD)
            cache_bytes = 2 * num_blocks * a.block_size * a.kv_heads * HEAD * 2
            dgen = torch.Generator(device=dev).manual_seed(seed)
            copies = [
                torch.randn(shape, generator=dgen, device=dev).to(torch.bfloat16)
                for _ in range(max(1, -(-2 * l2 // cache_bytes)))
            ]
            query = torch.randn(a.batch, a.q_heads, HEAD, generator=dgen, device=dev).to(torch.bfloat16)
            out = torch.empty_like(query)
            ref = step_reference(query, copies[0], md)
            kv_bytes = 2 * sum(order_lens) * a.kv_heads * HEAD * 2
            by_len = torch.tensor(order_lens).argsort(descending=True).to(torch.int32)
            # name -> (tile_seq, decode, ordered): the engine's decode call takes tile i as request i (decode)
            orders = {label: (call.tile_seq, True, False)}
            if label == "request order":
                orders["longest first"] = (by_len.to(dev), False, False)
                orders["ordered"] = (by_len.to(dev), True, True)
                orders["shortest first"] = (by_len.flip(0).to(dev), False, False)
            for name, (tile_seq, decode, ordered) in orders.items():

                def run(kv, tile_seq=tile_seq, decode=decode, ordered=ordered):
                    kc, vc = kv_views(kv, 1)
                    return paged_attention(
                        out, query, kc, vc, md.block_table, md.seq_lens, md.query_start_loc, tile_seq,
                        call.tile_start, HEAD**-0.5, num_splits=call.num_splits, split_token_range=call.token_range,
                        launch=call.launch, decode=decode, ordered=ordered,
                    )  # fmt: skip

                run(copies[0])
                err = float((out.float() - ref).abs().max())
                us = timing.time_per_call_us(run, copies)
                rows.append(
                    dict(seed=seed, order=name, us=round(us, 2), TBps=round(kv_bytes / us / 1e6, 3), max_abs=err,
                         ok=err <= TOLERANCE[torch.bfloat16] * max(1.0, float(ref.abs().max())),
                         splits=call.num_splits, mean_context=mean)
                )  # fmt: skip
                print(rows[-1], flush=True)
            del copies
    print(f"\n{'order':<16} {'us (median over seeds)':>24} {'TB/s':>8}")
    for name in ("request order", "longest first", "ordered", "shortest first", "uniform"):
        mine = sorted(r["us"] for r in rows if r["order"] == name)
        tb = sorted(r["TBps"] for r in rows if r["order"] == name)
        print(f"{name:<16} {mine[len(mine) // 2]:>24.1f} {tb[len(tb) // 2]:>8.3f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(args=vars(a), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
