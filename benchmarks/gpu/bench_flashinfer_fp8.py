"""FlashInfer's paged decode over an fp8 KV cache, each way it can run: the query's type (the cache's fp8 or
bf16), the kernel template (``fa2``/``fa3``, tensor cores) or the CUDA-core decode kernel, against the bf16
cache's run, in one process. Picks what FLASHINFER's builder should plan for an fp8 cache (issue 26).

    python -m benchmarks.gpu.bench_flashinfer_fp8 [--batch 64] [--context 8192] [--block-size 16] [--json OUT]
        [--variants NAME ...]

Shape: Llama-3 8B's attention (32 query / 8 KV heads, head 128), one decode step of one layer, pages a random
permutation of the cache. Data: N(0, 1) queries, N(0, 2^2) K/V (fp8: stored as ``x / scale``, saturated,
scales 12/448 and 10/448). Each variant's output against a float32 reference over the same (dequantized) cache
and, for an fp8 query, the same quantized query: ``rel`` = max |out - ref| / max |ref|. Time: the median of
5 runs of ``--repeats`` back-to-back calls in one CUDA graph (the cache is far larger than the L2). A variant
that fails to build or run prints its error and the run goes on. Set ``FLASHINFER_CUDA_ARCH_LIST=9.0
MAX_JOBS=16``: each new variant is a JIT compile (~30-120 s cold).
"""

from __future__ import annotations

import argparse
import json
import time
import traceback

import torch

E4M3 = torch.float8_e4m3fn
# name: (query dtype, use_tensor_cores, backend)
VARIANTS = {
    "bf16": (torch.bfloat16, True, "fa2"),  # the bf16 cache: what the builder plans today
    "fp8kv_bf16q_fa2_tc": (torch.bfloat16, True, "fa2"),
    "fp8kv_fp8q_fa3_tc": (E4M3, True, "fa3"),  # FLASHINFER's fp8 default (q quantized, backend auto -> fa3)
    "fp8kv_fp8q_fa2_tc": (E4M3, True, "fa2"),
    "fp8kv_bf16q_cuda_cores": (torch.bfloat16, False, "auto"),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS))
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    import flashinfer

    dev = torch.device("cuda")
    hq, hkv, d, bs = 32, 8, 128, a.block_size
    pages_per = -(-a.context // bs)
    num_pages = a.batch * pages_per
    gen = torch.Generator(device=dev).manual_seed(0)
    kv = 2.0 * torch.randn(num_pages, 2, bs, hkv, d, device=dev, generator=gen)
    k_scale, v_scale = 12 / 448, 10 / 448
    fmax = torch.finfo(E4M3).max
    kv8 = torch.empty_like(kv, dtype=E4M3)
    kv8[:, 0] = (kv[:, 0] / k_scale).clamp(-fmax, fmax).to(E4M3)
    kv8[:, 1] = (kv[:, 1] / v_scale).clamp(-fmax, fmax).to(E4M3)
    kv16 = kv.to(torch.bfloat16)
    q = torch.randn(a.batch, hq, d, device=dev, generator=gen, dtype=torch.bfloat16)
    perm = torch.randperm(num_pages, device=dev, generator=gen).to(torch.int32)
    indptr = torch.arange(0, num_pages + 1, pages_per, dtype=torch.int32, device=dev)
    last = torch.full((a.batch,), a.context - (pages_per - 1) * bs, dtype=torch.int32, device=dev)
    ws = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    scale = d**-0.5

    def reference(cache: torch.Tensor, query: torch.Tensor, ks: float, vs: float) -> torch.Tensor:
        out = torch.empty(a.batch, hq, d, device=dev)
        for b in range(a.batch):
            pages = perm[b * pages_per : (b + 1) * pages_per].long()
            k = (cache[pages, 0].float() * ks).reshape(-1, hkv, d)[: a.context]
            v = (cache[pages, 1].float() * vs).reshape(-1, hkv, d)[: a.context]
            k, v = k.repeat_interleave(hq // hkv, 1), v.repeat_interleave(hq // hkv, 1)
            p = torch.softmax(torch.einsum("hd,thd->ht", query[b].float(), k) * scale, -1)
            out[b] = torch.einsum("ht,thd->hd", p, v)
        return out

    rows = []
    for name in a.variants:
        q_dtype, tc, backend = VARIANTS[name]
        fp8 = name != "bf16"
        cache, kv_dtype = (kv8, E4M3) if fp8 else (kv16, torch.bfloat16)
        t0 = time.time()
        try:
            wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=tc, backend=backend)
            wrapper.plan(
                indptr,
                perm,
                last,
                hq,
                hkv,
                d,
                bs,
                q_data_type=q_dtype,
                kv_data_type=kv_dtype,
                o_data_type=torch.bfloat16,
                sm_scale=scale,
            )
            scales = dict(k_scale=k_scale, v_scale=v_scale) if fp8 else {}
            query = q
            if q_dtype == E4M3:  # q_scale 1.0, saturated (FLASHINFER's Impl)
                query = q.float().clamp(-fmax, fmax).to(E4M3)
                scales["q_scale"] = 1.0
            out = torch.empty(a.batch, hq, d, device=dev, dtype=torch.bfloat16)

            def call():
                wrapper.run(query, cache, out=out, **scales)

            call()
            torch.cuda.synchronize()
            build_s = time.time() - t0
            ref_q = query.float() if q_dtype == E4M3 else q.float()
            ref = reference(cache, ref_q, k_scale if fp8 else 1.0, v_scale if fp8 else 1.0)
            rel = ((out.float() - ref).abs().max() / ref.abs().max()).item()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(a.repeats):
                    call()
            graph.replay()
            times = []
            for _ in range(5):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                graph.replay()
                e.record()
                e.synchronize()
                times.append(s.elapsed_time(e) * 1e3 / a.repeats)
            us = sorted(times)[2]
            kv_bytes = 2 * a.batch * a.context * hkv * d * cache.element_size()
            rows.append({"variant": name, "us": us, "TBps": kv_bytes / us / 1e6, "rel": rel, "build_s": build_s})
        except Exception as e:  # noqa: BLE001 - one variant's failure is a row
            traceback.print_exc()
            rows.append({"variant": name, "error": f"{type(e).__name__}: {str(e)[:300]}", "build_s": time.time() - t0})
        print(json.dumps(rows[-1]), flush=True)
    base = next((r["us"] for r in rows if r["variant"] == "bf16" and "us" in r), None)
    print(f"\n{'variant':<26} {'us':>8} {'TB/s':>6} {'x bf16':>7} {'rel':>8} {'build s':>8}")
    for r in rows:
        if "us" in r:
            x = f"{base / r['us']:.2f}" if base else "-"
            print(f"{r['variant']:<26} {r['us']:8.1f} {r['TBps']:6.2f} {x:>7} {r['rel']:8.4f} {r['build_s']:8.1f}")
        else:
            print(f"{r['variant']:<26} {r['error']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
