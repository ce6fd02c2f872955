"""FlashAttention-3 paged decode (``flash_attn_with_kvcache``) as the engine's CUDA graphs call it, and with
the knobs it leaves at their defaults: the split-KV count, GQA packing, and host-planned scheduler metadata.

``python -m benchmarks.gpu.bench_fa3_decode [--json OUT]`` on a GPU with ``flash_attn_interface``.

Why: in a decode step captured by the engine, FA3 gets no scheduler metadata (``build_for_cudagraph_capture``),
so it plans its splits from the page table's width (``max_model_len``), not from the requests' lengths. The
profile of a Llama-3.1-8B batch-1 step (1k context) showed FA3 at 10.0 us + 2.7 us of combine per layer
for 4 MB of KV: latency, not bytes. This measures what each knob gives per shape:

- ``graph``: the engine's call (page table ``width`` blocks wide, ``cu_seqlens_q``, no metadata);
- ``splits=N``: the same with ``num_splits=N``;
- ``pack_gqa=B``: the same with ``pack_gqa`` forced;
- ``sched``: ``get_scheduler_metadata`` for the true lengths (computed once, before capture, as a per-step
  plan copied into a static buffer would be), with ``num_splits`` 0 or N;
- ``engine``: what the engine's graphs now run (``FlashAttentionMetadataBuilder.cudagraph_prologue``): the
  plan for the table's width with a bound of 16 splits.

Cases cover block sizes 16 to 256 (FA3 takes its TMA path for K/V only when pages are large enough).

Each time is one CUDA graph of back-to-back calls cycling through copies of the KV cache whose total exceeds
twice the L2 cache (``gemv.timing.time_per_call_us``, the GEMV plan's harness) (a decode step reads each layer's KV from HBM), CUDA events around the replays,
microseconds per call. Every variant's output is compared with the ``graph`` variant's (bf16 tolerance).
"""

from __future__ import annotations

import argparse
import json

import torch

from attnserve.gemv.timing import time_per_call_us

# name, batch, q heads, kv heads, context, page table width (blocks), block size: the engine's bench shapes
CASES = [
    ("llama_b1", 1, 32, 8, 1024, 256, 16),
    ("qwen_b64", 64, 16, 8, 1024, 256, 16),
    ("llama_b64", 64, 32, 8, 1024, 256, 16),
    ("qwen_b64_bs64", 64, 16, 8, 1024, 64, 64),
    ("qwen_b64_bs128", 64, 16, 8, 1024, 32, 128),
    ("qwen_b64_bs256", 64, 16, 8, 1024, 16, 256),
    ("llama_b1_bs128", 1, 32, 8, 1024, 32, 128),
]
HEAD = 128


def bench_case(fa, name: str, batch: int, hq: int, hkv: int, ctx: int, width: int, block: int) -> dict:
    dev = torch.device("cuda")
    per_req = -(-ctx // block)
    num_blocks = batch * per_req + 1
    kv_bytes = 2 * batch * ctx * hkv * HEAD * 2
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    copies = max(1, -(-2 * l2 // kv_bytes))
    caches = [
        (
            torch.randn(num_blocks, block, hkv, HEAD, device=dev, dtype=torch.bfloat16),
            torch.randn(num_blocks, block, hkv, HEAD, device=dev, dtype=torch.bfloat16),
        )
        for _ in range(copies)
    ]
    q = torch.randn(batch, hq, HEAD, device=dev, dtype=torch.bfloat16)
    table = torch.full((batch, width), num_blocks - 1, dtype=torch.int32, device=dev)
    perm = torch.randperm(batch * per_req, device=dev).to(torch.int32)  # scattered blocks, as a busy cache
    table[:, :per_req] = perm.view(batch, per_req)
    seqlens = torch.full((batch,), ctx, dtype=torch.int32, device=dev)
    cu_q = torch.arange(batch + 1, dtype=torch.int32, device=dev)

    def call(kv: tuple[torch.Tensor, torch.Tensor], **kw):
        kc, vc = kv
        out = fa.flash_attn_with_kvcache(
            q,
            kc,
            vc,
            cache_seqlens=seqlens,
            page_table=table,
            cu_seqlens_q=cu_q,
            max_seqlen_q=1,
            softmax_scale=HEAD**-0.5,
            causal=True,
            **kw,
        )
        return out[0] if isinstance(out, tuple) else out

    def sched(num_splits: int = 0, pack_gqa=None, max_k: int = ctx):
        return fa.get_scheduler_metadata(
            batch,
            1,
            max_k,
            hq,
            hkv,
            HEAD,
            seqlens,
            qkv_dtype=torch.bfloat16,
            cu_seqlens_q=cu_q,
            page_size=block,
            causal=True,
            num_splits=num_splits,
            pack_gqa=pack_gqa,
        )

    variants: dict[str, dict] = {"graph": {}}
    for s in (1, 4, 16):
        variants[f"splits={s}"] = {"num_splits": s}
    for p in (True, False):
        variants[f"pack_gqa={p}"] = {"pack_gqa": p}
    for s in (0, 1, 16, 32):
        variants[f"sched splits={s}"] = {"scheduler_metadata": sched(s), "num_splits": s}
    # the engine's graphs (flash_attn.py: cudagraph_prologue): planned for the table's width, bound 16
    variants["engine"] = {"scheduler_metadata": sched(16, max_k=width * block), "num_splits": 16}
    ref = call(caches[0]).float()
    rows = {}
    for label, kw in variants.items():
        try:
            err = float((call(caches[0], **kw).float() - ref).abs().max())
            us = time_per_call_us(lambda kv, kw=kw: call(kv, **kw), caches, calls=40)
            rows[label] = {"us": round(us, 2), "tbps": round(kv_bytes / us / 1e6, 3), "max_err": err}
        except Exception as e:  # a knob this build rejects: reported, never counted
            rows[label] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"}
    return {
        "case": name,
        "batch": batch,
        "q_heads": hq,
        "kv_heads": hkv,
        "context": ctx,
        "table_width": width,
        "block_size": block,
        "kv_mb": round(kv_bytes / 1e6, 2),
        "copies": copies,
        "variants": rows,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json")
    args = ap.parse_args()
    import flash_attn_interface as fa

    results = []
    for case in CASES:
        r = bench_case(fa, *case)
        results.append(r)
        base = r["variants"]["graph"].get("us")
        print(
            f"== {r['case']}: batch {r['batch']}, {r['q_heads']}/{r['kv_heads']} heads, ctx {r['context']}, "
            f"table {r['table_width']} x {r['block_size']}, KV {r['kv_mb']} MB"
        )
        for label, v in r["variants"].items():
            if "error" in v:
                print(f"   {label:18s} {v['error']}")
            else:
                print(
                    f"   {label:18s} {v['us']:8.2f} us  {v['tbps']:6.3f} TB/s  x{base / v['us']:5.2f}  "
                    f"err {v['max_err']:.2e}"
                )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
