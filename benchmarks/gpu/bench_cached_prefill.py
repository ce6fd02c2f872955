"""A prefill over a cached context, kernel by kernel: R requests of Q new tokens each, behind one shared cached
prefix of P tokens (the shared-prefix workload's second step), through FlashAttention 3.

``python -m benchmarks.gpu.bench_cached_prefill [--requests 128] [--queries 128] [--prefix 2048] [--json OUT]``

Variants (all bf16, GQA 16/8 x 128, Qwen3-0.6B's attention):
- ``paged-N``: one ``flash_attn_with_kvcache`` over the whole context with N-token pages (what a step runs now
  with N = the block size);
- ``paged-cascade``: the prefix once for all queries (non-causal, paged) + each suffix (paged), merged;
- ``dense-cascade``: the prefix's K/V gathered into contiguous tensors and attended by the dense varlen kernel
  (TMA loads), each suffix by the dense causal varlen kernel over this step's K/V, merged.
Times are medians of ``triton.testing.do_bench``; the table gives TFLOP/s of the attention's useful work.
"""

from __future__ import annotations

import argparse
import json

import torch
import triton


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--queries", type=int, default=128)
    ap.add_argument("--prefix", type=int, default=2048)
    ap.add_argument("--json")
    a = ap.parse_args()
    import flash_attn_interface as fa

    from attnserve.kernels.merge_attn_states import merge_attn_states

    dev, dt = "cuda", torch.bfloat16
    R, Q, P, H, KH, D = a.requests, a.queries, a.prefix, 16, 8, 128
    L = P + Q
    T = R * Q
    torch.manual_seed(0)
    q = torch.randn(T, H, D, device=dev, dtype=dt)
    k_new = torch.randn(T, KH, D, device=dev, dtype=dt)
    v_new = torch.randn(T, KH, D, device=dev, dtype=dt)
    k_pre = torch.randn(P, KH, D, device=dev, dtype=dt)
    v_pre = torch.randn(P, KH, D, device=dev, dtype=dt)
    cu_q = torch.arange(0, T + 1, Q, device=dev, dtype=torch.int32)
    seqlens = torch.full((R,), L, device=dev, dtype=torch.int32)
    scale = D**-0.5
    flops = 4 * H * D * R * (Q * P + Q * (Q + 1) / 2)
    results: dict[str, dict] = {}

    def paged_cache(page: int):
        """Cache of pages: the shared prefix's pages once, then each request's own pages (prefix tail + suffix)."""
        assert P % page == 0
        pre_pages = P // page
        own = -(-Q // page)
        nblocks = pre_pages + R * own + 1
        kc = torch.zeros(nblocks, page, KH, D, device=dev, dtype=dt)
        vc = torch.zeros_like(kc)
        kc[:pre_pages].view(-1, KH, D)[:P] = k_pre
        vc[:pre_pages].view(-1, KH, D)[:P] = v_pre
        table = torch.zeros(R, pre_pages + own, device=dev, dtype=torch.int32)
        table[:, :pre_pages] = torch.arange(pre_pages, device=dev, dtype=torch.int32)
        for r in range(R):
            first = pre_pages + r * own
            table[r, pre_pages:] = torch.arange(first, first + own, device=dev, dtype=torch.int32)
            kc[first : first + own].view(-1, KH, D)[:Q] = k_new[r * Q : (r + 1) * Q]
            vc[first : first + own].view(-1, KH, D)[:Q] = v_new[r * Q : (r + 1) * Q]
        return kc, vc, table

    def record(name: str, fn) -> torch.Tensor:
        out = fn()
        ms = triton.testing.do_bench(fn, warmup=25, rep=100)
        results[name] = {"ms": ms, "tflops": flops / ms / 1e9}
        print(f"{name:>16}: {ms:8.3f} ms  {flops / ms / 1e9:7.1f} TFLOP/s", flush=True)
        return out

    ref = None
    for page in (16, 64, 128, 256):
        kc, vc, table = paged_cache(page)

        def paged(kc=kc, vc=vc, table=table):
            out = fa.flash_attn_with_kvcache(
                q,
                kc,
                vc,
                cache_seqlens=seqlens,
                page_table=table,
                cu_seqlens_q=cu_q,
                max_seqlen_q=Q,
                softmax_scale=scale,
                causal=True,
            )
            return out[0] if isinstance(out, tuple) else out

        out = record(f"paged-{page}", paged)
        if ref is None:
            ref = out
        results[f"paged-{page}"]["max_diff"] = float((out.float() - ref.float()).abs().max())
        if page == 16:
            pre_table = table[:1, : P // page].contiguous()
            pre_len = torch.tensor([P], device=dev, dtype=torch.int32)
            pre_cu = torch.tensor([0, T], device=dev, dtype=torch.int32)
            suf_table = table[:, P // page :].contiguous()
            suf_len = torch.full((R,), Q, device=dev, dtype=torch.int32)

            def paged_cascade(kc=kc, vc=vc):
                o1, l1, *_ = fa.flash_attn_with_kvcache(
                    q,
                    kc,
                    vc,
                    cache_seqlens=pre_len,
                    page_table=pre_table,
                    cu_seqlens_q=pre_cu,
                    max_seqlen_q=T,
                    softmax_scale=scale,
                    causal=False,
                    return_softmax_lse=True,
                )
                o2, l2, *_ = fa.flash_attn_with_kvcache(
                    q,
                    kc,
                    vc,
                    cache_seqlens=suf_len,
                    page_table=suf_table,
                    cu_seqlens_q=cu_q,
                    max_seqlen_q=Q,
                    softmax_scale=scale,
                    causal=True,
                    return_softmax_lse=True,
                )
                return merge_attn_states(o1, l1, o2, l2)

            out = record("paged-cascade", paged_cascade)
            results["paged-cascade"]["max_diff"] = float((out.float() - ref.float()).abs().max())
            flat = torch.arange(P, device=dev)
            slots = pre_table[0].long().repeat_interleave(page) * page + flat % page
            pre_cu_k = torch.tensor([0, P], device=dev, dtype=torch.int32)

            def dense_cascade(kc=kc, vc=vc, slots=slots):
                kp = kc.view(-1, KH, D).index_select(0, slots)
                vp = vc.view(-1, KH, D).index_select(0, slots)
                o1, l1, *_ = fa.flash_attn_varlen_func(
                    q, kp, vp, pre_cu, pre_cu_k, T, P, softmax_scale=scale, causal=False, return_attn_probs=True
                )
                o2, l2, *_ = fa.flash_attn_varlen_func(
                    q, k_new, v_new, cu_q, cu_q, Q, Q, softmax_scale=scale, causal=True, return_attn_probs=True
                )
                return merge_attn_states(o1, l1, o2, l2)

            out = record("dense-cascade", dense_cascade)
            results["dense-cascade"]["max_diff"] = float((out.float() - ref.float()).abs().max())

            def gather_only(kc=kc, vc=vc, slots=slots):
                return kc.view(-1, KH, D).index_select(0, slots), vc.view(-1, KH, D).index_select(0, slots)

            ms = triton.testing.do_bench(gather_only, warmup=25, rep=100)
            results["gather-prefix"] = {"ms": ms}
            print(f"   gather-prefix: {ms:8.3f} ms", flush=True)
        del kc, vc
    print(json.dumps({"shape": dict(R=R, Q=Q, P=P, H=H, KH=KH, D=D), "results": results}, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"shape": dict(R=R, Q=Q, P=P, H=H, KH=KH, D=D), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
