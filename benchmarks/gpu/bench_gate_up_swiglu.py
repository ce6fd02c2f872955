"""The SwiGLU fused into the gate/up projection's epilogue (``triton_gemv.gemv(x, w_gate_up, out_act="silu_mul")``)
against the gate/up projection then ``silu_and_mul`` (cuBLAS, or the plain Triton GEMV), on the gate/up shapes
of Llama-3.1-8B (I 14336, K 4096) and Qwen3-0.6B (I 3072, K 1024), bfloat16, decode M = 1..64; and, with
``--sweep-ms``, the tensor-core tiles without a K split (or with 2) that the start-up plan does not try, on
every Qwen3-0.6B GEMM shape, against cuBLAS.

``python -m benchmarks.gpu.bench_gate_up_swiglu [--json OUT] [--models llama qwen] [--ms 1 4 16 32 48 64]
[--sweep-ms 64]`` on a GPU.

Timing: ``gemv.timing.time_per_call_us`` (what the start-up plan uses): one CUDA graph of back-to-back calls
cycling through weight copies that exceed twice the L2 cache, CUDA events around 10 replays, microseconds per
call. Columns, per (shape, M):

- ``+cuBLAS``: ``F.linear`` (the (M, 2I) gate/up output), then ``silu_and_mul``;
- ``+GEMV``: the plain Triton GEMV with the best start-up candidate for (2I, K, M), then ``silu_and_mul``;
- ``fused``: the best fused GEMV over the start-up candidates for (2I, K, M) and the extra tiles
  (:func:`extra_configs`); its label; and whether its bits equal ``+GEMV``'s with the same config;
- ``x``: ``min(+cuBLAS, +GEMV) / fused``.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

SHAPES = {"llama": ("Llama-3.1-8B", 14336, 4096), "qwen": ("Qwen3-0.6B", 3072, 1024)}  # gate/up: (I, K)
QWEN_GEMMS = [("qkv", 4096, 1024), ("o", 1024, 2048), ("gate_up", 6144, 1024), ("down", 1024, 3072)]


def extra_configs(n: int, k: int, m: int) -> list:
    """Tensor-core tiles of 16..128 weight rows, K steps of 64..256, 3 or 4 stages, 4 or 8 warps, with no
    K split or 2 (fitted to M rows and shared memory); FMA configs up to 16 rows are the candidates' job."""
    from attnserve.kernels.triton_gemv import MAX_FMA_M, GemvConfig, fit_config

    if m <= MAX_FMA_M // 4:
        return []
    out = []
    for bn in (16, 32, 64, 128):
        for bk in (64, 128, 256):
            for stages in (3, 4):
                for warps in (4, 8) if bn >= 64 else (4,):
                    for split in (1, 2):
                        if bk * split <= k:
                            out.append(fit_config(GemvConfig(bn, bk, split, warps, stages, dot=True), m))
    return list(dict.fromkeys(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--models", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    ap.add_argument("--ms", nargs="+", type=int, default=[1, 4, 16, 32, 48, 64])
    ap.add_argument("--sweep-ms", nargs="*", type=int, default=[])
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--replays", type=int, default=10)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_gate_up_swiglu needs a CUDA GPU")

    from attnserve.gemv import timing as gemv_timing
    from attnserve.kernels import pdl
    from attnserve.gemv.tiles import candidate_configs
    from attnserve.kernels.triton_fused_ops import silu_and_mul
    from attnserve.kernels.triton_gemv import gemv

    pdl.configure(pdl.supported("cuda"))
    dev = torch.device("cuda")
    torch.manual_seed(0)
    l2 = gemv_timing.l2_bytes(dev)
    t = lambda call, copies: gemv_timing.time_per_call_us(call, copies, args.calls, args.replays)  # noqa: E731
    rows = []
    print(f"{'model':<13} {'M':>3} {'+cuBLAS':>8} {'+GEMV':>8} {'fused':>8} {'x':>5}  fused config / same bits")
    for key in args.models:
        model, inter, k = SHAPES[key]
        w = torch.randn(2 * inter, k, device=dev, dtype=torch.bfloat16) / k**0.5
        copies = gemv_timing.weight_copies(w, 2 * l2)
        for m in args.ms:
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            want = silu_and_mul(F.linear(x, w))
            cublas = t(lambda v: silu_and_mul(F.linear(x, v)), copies)
            plain = gemv_timing.time_candidates(
                lambda v, cfg: silu_and_mul(gemv(x, v, None, cfg)),
                want,
                copies,
                2 * inter,
                k,
                m,
                candidate_configs(2 * inter, k, m),
                args.calls,
                args.replays,
            )
            fused_cfgs = [
                c
                for c in dict.fromkeys(candidate_configs(2 * inter, k, m) + extra_configs(2 * inter, k, m))
                if c.block_n >= 2
            ]
            fused = gemv_timing.time_candidates(
                lambda v, cfg: gemv(x, v, None, cfg, out_act="silu_mul"),
                want,
                copies,
                inter,
                k,
                m,
                fused_cfgs,
                args.calls,
                args.replays,
            )
            best_plain = min(plain, key=lambda p: p[0]) if plain else (None, None)
            best_fused = min(fused, key=lambda p: p[0]) if fused else (None, None)
            same = None
            if best_fused[1] is not None:
                cfg = best_fused[1]
                same = bool(torch.equal(gemv(x, w, None, cfg, out_act="silu_mul"), silu_and_mul(gemv(x, w, None, cfg))))
            base = min(cublas, best_plain[0]) if best_plain[0] is not None else cublas
            ratio = base / best_fused[0] if best_fused[0] else None
            row = dict(
                model=model,
                m=m,
                inter=inter,
                k=k,
                cublas_silu_us=cublas,
                gemv_silu_us=best_plain[0],
                gemv_config=best_plain[1].label() if best_plain[1] else None,
                fused_us=best_fused[0],
                fused_config=best_fused[1].label() if best_fused[1] else None,
                fused_same_bits=same,
                ratio=ratio,
                fused_all={c.label(): us for us, c in fused},
            )
            rows.append(row)
            print(
                f"{model:<13} {m:>3} {cublas:8.2f} {best_plain[0] or float('nan'):8.2f} "
                f"{best_fused[0] or float('nan'):8.2f} {ratio or float('nan'):5.2f}  {row['fused_config']} / {same}",
                flush=True,
            )

    sweep = []
    for m in args.sweep_ms:
        for layer, n, k in QWEN_GEMMS:
            w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) / k**0.5
            copies = gemv_timing.weight_copies(w, 2 * l2)
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            want = F.linear(x, w)
            cublas = t(lambda v: F.linear(x, v), copies)
            timed = gemv_timing.time_candidates(
                lambda v, cfg: gemv(x, v, None, cfg),
                want,
                copies,
                n,
                k,
                m,
                extra_configs(n, k, m),
                args.calls,
                args.replays,
            )
            cands = gemv_timing.time_candidates(
                lambda v, cfg: gemv(x, v, None, cfg),
                want,
                copies,
                n,
                k,
                m,
                candidate_configs(n, k, m),
                args.calls,
                args.replays,
            )
            best = min(timed, key=lambda p: p[0])
            best_c = min(cands, key=lambda p: p[0])
            sweep.append(
                dict(
                    layer=layer,
                    n=n,
                    k=k,
                    m=m,
                    cublas_us=cublas,
                    best_extra_us=best[0],
                    best_extra=best[1].label(),
                    best_candidate_us=best_c[0],
                    best_candidate=best_c[1].label(),
                    extra_all={c.label(): us for us, c in timed},
                )
            )
            print(
                f"sweep qwen {layer:<8} M={m:<3} cuBLAS {cublas:6.2f}  best extra {best[0]:6.2f} "
                f"({best[1].label()})  best candidate {best_c[0]:6.2f} ({best_c[1].label()})",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(gate_up_swiglu=rows, sweep=sweep), f, indent=1)


if __name__ == "__main__":
    main()
