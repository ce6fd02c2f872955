"""One cascade decode step's attention, TRITON_ATTN against FlashAttention 3, call by call, in one process.

``python -m benchmarks.gpu.bench_cascade_step [--batch 256] [--prefix 2048] [--json OUT]`` on a GPU;
``TRITON_INTERPRET=1 ... --tiny`` checks the script on CPU (small shapes, no timings).

The shared-prefix workload of docs/benchmarks.md ("Prefix caching": 2,048 shared + 128 own tokens, 256 requests,
Qwen3-0.6B's 16 query / 8 KV heads of 128) decodes in cascade steps (``attention/cascade.py``): every query over
the prefix in one non-causal call, each request over its own suffix, the two merged. Variants, each a CUDA graph of
``--layers`` calls over as many cache copies (past the L2 cache, as a step's layers are), median replay per call:
``fa3``: ``flash_attn_cascade.paged_cascade``'s three calls; ``triton``: the engine's prefix call (the builder's
tiles, launch and split count), suffix call and merge; ``triton/<variant>``: the prefix call with other rows,
splits, warps, stages or KV tiles. ``*:prefix``, ``*:suffix``, ``*:merge``: one part alone. Every whole variant's
output is compared with a float32 reference of plain attention over prefix + suffix (``max_abs``).
"""

from __future__ import annotations

import argparse
import json
import math
import os

import torch

# name -> (rows, splits, warps, stages, pages per KV tile): the prefix call's tiles and launch
PREFIX_VARIANTS = {
    "r64s2": (64, 2, 4, 2, 4),
    "r64s4": (64, 4, 4, 2, 4),
    "r64s16": (64, 16, 4, 2, 4),
    "r64s4st3": (64, 4, 4, 3, 4),
    "r64s8st3": (64, 8, 4, 3, 4),
    "r64s4p8": (64, 4, 4, 2, 8),
    "r64s8p8": (64, 8, 4, 2, 8),
    "r128s4w8": (128, 4, 8, 2, 4),
    "r128s8w8": (128, 8, 8, 2, 4),
    "r128s4w4": (128, 4, 4, 2, 4),
    "r32s8": (32, 8, 4, 2, 4),
    "r32s16": (32, 16, 4, 2, 4),
}


def build(args, dev: torch.device) -> dict:
    """Block tables (the prefix's blocks first in every row, then the request's own, in random order), sequence
    lengths ``prefix + U[own, own + decoded]``, the queries and ``args.layers`` caches ``(N, 2, page, Hkv, D)``."""
    g = torch.Generator().manual_seed(0)
    b, page = args.batch, args.page
    prefix_blocks = args.prefix // page
    suffix_lens = torch.randint(args.own + 1, args.own + args.decoded + 1, (b,), generator=g, dtype=torch.int32)
    own_blocks = [(int(n) + page - 1) // page for n in suffix_lens]
    width = max(own_blocks)
    free = torch.randperm(b * width, generator=g) + prefix_blocks
    table = torch.zeros(b, width, dtype=torch.int32)
    for i, n in enumerate(own_blocks):
        table[i, :n] = free[i * width : i * width + n]
    num_blocks = prefix_blocks + b * width
    caches = [
        torch.randn(num_blocks, 2, page, args.kv_heads, args.head, generator=g).to(dev, torch.bfloat16)
        for _ in range(args.layers)
    ]
    query = torch.randn(b, args.heads, args.head, generator=g).to(dev, torch.bfloat16)
    return dict(
        table=table.to(dev),
        table_cpu=table,
        seq_lens=suffix_lens.to(dev),
        seq_lens_cpu=suffix_lens,
        qsl=torch.arange(b + 1, dtype=torch.int32, device=dev),
        prefix_table=torch.arange(prefix_blocks, dtype=torch.int32, device=dev)[None],
        prefix_lens=torch.tensor([args.prefix], dtype=torch.int32, device=dev),
        prefix_qsl=torch.tensor([0, b], dtype=torch.int32, device=dev),
        caches=caches,
        query=query,
    )


def reference(args, s: dict) -> torch.Tensor:
    """float32 attention of each query over its prefix + suffix keys (the first cache copy)."""
    k, v = s["caches"][0][:, 0].float(), s["caches"][0][:, 1].float()
    page, group = args.page, args.heads // args.kv_heads
    prefix_idx = torch.arange(args.prefix, device=k.device)
    out = torch.empty(args.batch, args.heads, args.head, device=k.device)
    for i in range(args.batch):
        n = int(s["seq_lens_cpu"][i])
        blocks = s["table_cpu"][i, : (n + page - 1) // page].to(k.device)
        own = (blocks[:, None] * page + torch.arange(page, device=k.device)).flatten()[:n]
        slots = torch.cat([prefix_idx, own])
        ks = k.flatten(0, 1)[slots].repeat_interleave(group, 1)  # (L, Hq, D)
        vs = v.flatten(0, 1)[slots].repeat_interleave(group, 1)
        scores = torch.einsum("hd,lhd->hl", s["query"][i].float(), ks) / math.sqrt(args.head)
        out[i] = torch.einsum("hl,lhd->hd", scores.softmax(-1), vs)
    return out


def triton_cascade(args, s: dict, variant: tuple | None, part: str = "all", fold: bool = True):
    """A callable(cache) running TRITON_ATTN's cascade calls (``part``: all, prefix, suffix or merge) with the prefix
    call's ``variant`` (rows, splits, warps, stages, pages; None: the engine's builder's choice). ``fold``: the
    suffix call folds the prefix's partial results in (the engine's unsplit suffix); else it writes its own slot
    and a merge kernel reads all (the engine before, and its split suffix)."""
    from attnserve.attention.backends import triton_attn_plan as triton_attn
    from attnserve.kernels.attention_tiles import block_m_for, query_tiles
    from attnserve.kernels.triton_attention import paged_attention
    from attnserve.kernels.triton_merge_splits import merge_splits, partial_results

    b, hq, head = args.batch, args.heads, args.head
    if variant is None:  # the builder's: _prefill_tiling's rows, launch and pages; its split rule
        rows, launch, pages = triton_attn._PREFILL_ROWS, dict(triton_attn._PREFILL_LAUNCH), None
        pages = triton_attn._PREFILL_KV_TOKENS // args.page
        block_q = block_m_for(hq // args.kv_heads, rows)[1]
        programs = -(-b // block_q) * args.kv_heads
        tile = pages * args.page
        splits = triton_attn.cascade_prefix_splits(programs, args.num_sms, args.prefix // tile)
    else:
        rows, splits, warps, stages, pages = variant
        launch = {"num_warps": warps, "num_stages": stages}
    block_q = block_m_for(hq // args.kv_heads, rows)[1]
    pseq, pstart = (t.to(s["query"].device) for t in query_tiles(torch.tensor([0, b], dtype=torch.int32), block_q))
    sseq, sstart = (
        t.to(s["query"].device)
        for t in query_tiles(torch.arange(b + 1, dtype=torch.int32), block_m_for(hq // args.kv_heads, 16)[1])
    )
    q, scale = s["query"], 1.0 / math.sqrt(head)
    slots = splits + (0 if fold else 1)
    parts = partial_results(b, hq, slots, head, q.device)
    out = torch.empty_like(q)

    def run(cache):
        kc, vc = cache[:, 0], cache[:, 1]
        if part in ("all", "prefix"):
            paged_attention(
                out, q, kc, vc, s["prefix_table"], s["prefix_lens"], s["prefix_qsl"], pseq, pstart, scale,
                num_splits=splits, launch=launch, block_m=rows, pages_per_tile=pages, causal=False, parts=parts,
            )  # fmt: skip
        if part in ("all", "suffix"):
            paged_attention(
                out, q, kc, vc, s["table"], s["seq_lens"], s["qsl"], sseq, sstart, scale,
                launch=triton_attn._DECODE_LAUNCH[False], decode=True, parts=parts,
                **(dict(fold=True) if fold else dict(part_base=splits)),
            )  # fmt: skip
        if part in ("all", "merge") and not fold:
            merge_splits(out, *parts, (0, b), head)
        return out

    return run, dict(rows=rows, splits=splits, launch=launch, pages=pages)


def fa3_cascade(args, s: dict, part: str = "all"):
    """A callable(cache) running FlashAttention 3's cascade calls (``flash_attn_cascade.paged_cascade``'s)."""
    import flash_attn_interface as fa

    from attnserve.kernels.merge_attn_states import merge_attn_states

    q, scale = s["query"], 1.0 / math.sqrt(args.head)
    common = dict(softmax_scale=scale, return_softmax_lse=True)
    state = {}

    def run(cache):
        kc, vc = cache[:, 0], cache[:, 1]
        if part in ("all", "prefix"):
            state["p"] = fa.flash_attn_with_kvcache(
                q, kc, vc, cache_seqlens=s["prefix_lens"], page_table=s["prefix_table"],
                cu_seqlens_q=s["prefix_qsl"], max_seqlen_q=args.batch, causal=False, **common,
            )[:2]  # fmt: skip
        if part in ("all", "suffix"):
            state["s"] = fa.flash_attn_with_kvcache(
                q, kc, vc, cache_seqlens=s["seq_lens"], page_table=s["table"], cu_seqlens_q=s["qsl"],
                max_seqlen_q=1, causal=True, **common,
            )[:2]  # fmt: skip
        if part == "all":
            return merge_attn_states(*state["p"], *state["s"])
        return None

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--prefix", type=int, default=2048)
    ap.add_argument("--own", type=int, default=128, help="each request's own prompt tokens")
    ap.add_argument("--decoded", type=int, default=128, help="suffix lengths: own + U[1, decoded]")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head", type=int, default=128)
    ap.add_argument("--page", type=int, default=16)
    ap.add_argument("--layers", type=int, default=8, help="cache copies a graph cycles through")
    ap.add_argument("--calls", type=int, default=28, help="calls per graph (a step's layers)")
    ap.add_argument("--variants", nargs="*", default=list(PREFIX_VARIANTS))
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.tiny:
        args.batch, args.prefix, args.own, args.decoded, args.layers = 12, 64, 8, 8, 1
        args.heads, args.kv_heads = 4, 2
    dev = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    if args.tiny:  # the interpreter multiplies bfloat16 bit patterns in tl.dot: the tests' fix
        from tests.kernels.triton_attention_interpreted import fix_interpreter_bf16_dot

        fix_interpreter_bf16_dot()
    args.num_sms = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 4
    s = build(args, dev)
    ref = reference(args, s)
    timed = dev.type == "cuda" and os.environ.get("TRITON_INTERPRET") != "1"
    if timed:
        from benchmarks.gpu.bench_fp8_decode import graph_median_us

    rows = []

    def record(name: str, fn, whole: bool, meta: dict | None = None) -> None:
        err = None
        if whole:
            err = (fn(s["caches"][0]).float() - ref).abs().max().item()
        us = graph_median_us(fn, s["caches"], calls=args.calls) if timed else None
        rows.append(dict(name=name, us=us, max_abs=err, **(meta or {})))
        print(f"{name:28s} {us if us is None else round(us, 2)!s:>9} us   max_abs {err}", flush=True)

    have_fa3 = False
    if dev.type == "cuda":
        try:
            import flash_attn_interface  # noqa: F401

            have_fa3 = True
        except ImportError:
            print("FlashAttention 3 not installed: no fa3 rows")
    if have_fa3:
        record("fa3", fa3_cascade(args, s), True)
        for part in ("prefix", "suffix"):
            record(f"fa3:{part}", fa3_cascade(args, s, part), False)
    run, meta = triton_cascade(args, s, None)
    record("triton", run, True, meta)
    for part in ("prefix", "suffix"):
        record(f"triton:{part}", triton_cascade(args, s, None, part)[0], False)
    run, meta = triton_cascade(args, s, None, fold=False)
    record("triton-merge", run, True, meta)  # the suffix's own slot and a merge kernel (the engine before)
    for part in ("suffix", "merge"):
        record(f"triton-merge:{part}", triton_cascade(args, s, None, part, fold=False)[0], False)
    for name in args.variants:
        variant = PREFIX_VARIANTS[name]
        if args.tiny:
            variant = (*variant[:1], min(variant[1], 2), *variant[2:4], 1)
        try:
            run, meta = triton_cascade(args, s, variant)
            record(f"triton/{name}", run, True, meta)
            record(f"triton/{name}:prefix", triton_cascade(args, s, variant, "prefix")[0], False)
        except Exception as exc:  # a variant that fails to compile (registers, shared memory) is a row, not an end
            rows.append(dict(name=f"triton/{name}", error=repr(exc)[:300]))
            print(f"triton/{name}: {exc!r}"[:300], flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(args=vars(args), device=str(dev), rows=rows), f, indent=1, default=str)


if __name__ == "__main__":
    main()
