"""The SwiGLU fused into the down projection's GEMV (``triton_gemv.gemv(gate_up, w, act="silu_mul")``) against
``silu_and_mul`` then the down projection (cuBLAS, or the plain Triton GEMV), on the down shapes of
Llama-3.1-8B (N 4096, K 14336) and Qwen3-0.6B (N 1024, K 3072), bfloat16, decode M = 1, 2, 4, 8, 16, 32, 48,
64.

``python -m benchmarks.gpu.bench_silu_mul_gemv [--json OUT] [--models llama qwen] [--ms 1 2 4 8 16 32 48 64]`` on a GPU;
``--dry-run`` checks the script on CPU (``TRITON_INTERPRET=1``, shapes / 64, wall-clock times of one call:
meaningless as timings).

Timing: ``gemv.timing.time_per_call_us`` (what the start-up plan uses): one CUDA graph of back-to-back calls
cycling through weight copies that exceed twice the L2 cache, CUDA events around 10 replays, microseconds
per call. Columns, per (shape, M):

- ``silu``: ``silu_and_mul`` alone (its launch in a graph, the (M, 2K) read and (M, K) write);
- ``+cuBLAS``: ``silu_and_mul`` then ``F.linear``;
- ``+GEMV``: ``silu_and_mul`` then the plain Triton GEMV with the best start-up candidate for (N, K, M);
- ``fused same``: the fused GEMV with that same config (its bits are checked equal to ``+GEMV``'s), where
  that config is one of the fused candidates (past 16 rows they have shorter K steps: ``fit_config``);
- ``fused best``: the best start-up candidate of the fused GEMV (``candidate_configs(..., act="silu_mul")``,
  the ones ``GemvPlan`` would compare);
- ``saved``: ``min(+cuBLAS, +GEMV) - fused best``: what one down projection per layer saves per step, and
  ``x``: the ratio (GemvPlan picks the fused GEMV where it is >= 1.05).
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

SHAPES = {"llama": ("Llama-3.1-8B", 4096, 14336), "qwen": ("Qwen3-0.6B", 1024, 3072)}  # down: (N, K = I)


def _wall_us(call, weights, calls=1, replays=1) -> float:  # --dry-run's stand-in for the CUDA-graph timing
    t = time.perf_counter()
    call(weights[0])
    return (time.perf_counter() - t) * 1e6


def _f(v: float | None, width: int) -> str:
    return f"{v:>{width}.2f}" if v is not None else f"{'-':>{width}}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--models", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    ap.add_argument("--ms", nargs="+", type=int, default=[1, 2, 4, 8, 16, 32, 48, 64])
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--dry-run", action="store_true", help="check this script on CPU (see the docstring)")
    args = ap.parse_args()
    if not torch.cuda.is_available() and not args.dry_run:
        raise SystemExit("bench_silu_mul_gemv needs a CUDA GPU")

    from attnserve.gemv import choices as gemv_plan, tiles as gemv_tiles, timing as gemv_timing
    from attnserve.kernels.fused_ops import silu_and_mul
    from attnserve.kernels.triton_gemv import gemv, prepare

    time_us = gemv_timing.time_per_call_us
    shapes = dict(SHAPES)
    if args.dry_run:
        dev, name, num_sms, l2 = torch.device("cpu"), "CPU (dry run)", 132, 1 << 20
        time_us = gemv_timing.time_per_call_us = _wall_us  # also for gemv_timing.time_candidates
        shapes = {key: (label, n // 64, k // 64) for key, (label, n, k) in shapes.items()}
    else:
        dev = torch.device("cuda")
        props = torch.cuda.get_device_properties(dev)
        name, num_sms, l2 = props.name, props.multi_processor_count, gemv_timing.l2_bytes(dev)
    prepare(dev)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    print(
        f"{name}: {num_sms} SMs, L2 {l2 >> 20} MiB; torch {torch.__version__}, "
        f"triton {__import__('triton').__version__}; microseconds per call"
    )
    head = (
        f"{'model':<13} {'N':>5} {'K':>6} {'M':>2} | {'silu':>6} {'+cuBLAS':>8} {'+GEMV':>8} | "
        f"{'fused same':>10} {'fused best':>10} | {'saved':>6} {'x':>5} | fused config"
    )
    print(head)
    print("-" * len(head))
    rows, dtype, t0 = [], torch.bfloat16, time.perf_counter()
    g = torch.Generator(device=dev).manual_seed(0)
    with torch.no_grad():
        for key in args.models:
            label, n, k = shapes[key]
            w = torch.randn(n, k, device=dev, dtype=dtype, generator=g) * k**-0.5
            copies = gemv_timing.weight_copies(w, 2 * l2)
            for m in args.ms:
                gate_up = torch.randn(m, 2 * k, device=dev, dtype=dtype, generator=g) * 3
                act = silu_and_mul(gate_up)
                want = F.linear(act, w)
                cands = gemv_tiles.candidate_configs(n, k, m, 2, num_sms)
                silu_us = time_us(lambda v: silu_and_mul(gate_up), copies, args.calls, args.replays)
                cublas_us = time_us(lambda v: F.linear(silu_and_mul(gate_up), v), copies, args.calls, args.replays)
                plain = gemv_timing.time_candidates(
                    lambda v, cfg: gemv(silu_and_mul(gate_up), v, None, cfg),
                    want,
                    copies,
                    n,
                    k,
                    m,
                    cands,
                    args.calls,
                    args.replays,
                )
                plain_us, plain_cfg, _ = gemv_plan.pick_fastest(cublas_us, plain, 0.0)
                fused_cands = gemv_tiles.candidate_configs(n, k, m, 2, num_sms, act="silu_mul")
                fused = gemv_timing.time_candidates(
                    lambda v, cfg: gemv(gate_up, v, None, cfg, act="silu_mul"),
                    want,
                    copies,
                    n,
                    k,
                    m,
                    fused_cands,
                    args.calls,
                    args.replays,
                )
                fused_us, fused_cfg, _ = gemv_plan.pick_fastest(cublas_us, fused, 0.0)
                same_us = next((us for us, cfg in fused if cfg == plain_cfg), None)
                bitwise = None
                if plain_cfg is not None:
                    a, b = gemv(gate_up, w, None, plain_cfg, act="silu_mul"), gemv(act, w, None, plain_cfg)
                    sync()
                    bitwise = bool(torch.equal(a, b))
                unfused_us = min(cublas_us, plain_us) if plain_us is not None else cublas_us
                saved = unfused_us - fused_us if fused_us is not None else None
                row = dict(
                    model=label,
                    n=n,
                    k=k,
                    m=m,
                    silu_us=silu_us,
                    silu_cublas_us=cublas_us,
                    silu_gemv_us=plain_us,
                    gemv_config=plain_cfg and plain_cfg.label(),
                    fused_same_us=same_us,
                    fused_best_us=fused_us,
                    fused_config=fused_cfg and fused_cfg.label(),
                    fused_equals_unfused_bitwise=bitwise,
                    saved_us=saved,
                    speedup=fused_us and unfused_us / fused_us,
                    fused_timed={cfg.label(): us for us, cfg in fused},
                )
                rows.append(row)
                print(
                    f"{label:<13} {n:>5} {k:>6} {m:>2} | {silu_us:>6.2f} {cublas_us:>8.2f} {_f(plain_us, 8)} | "
                    f"{_f(same_us, 10)} {_f(fused_us, 10)} | {_f(saved, 6)} {_f(row['speedup'], 5)} | "
                    f"{row['fused_config'] or '-'}{'' if bitwise is not False else '  FUSED != UNFUSED (bits)'}",
                    flush=True,
                )
            del copies, w
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    elapsed = time.perf_counter() - t0
    wins = sum(1 for r in rows if r["speedup"] and r["speedup"] >= 1.05)
    print(
        f"\nfused >= 5% faster than silu_and_mul + the best unfused in {wins}/{len(rows)} (shape, M); "
        f"bitwise mismatches {sum(1 for r in rows if r['fused_equals_unfused_bitwise'] is False)}; {elapsed:.1f} s"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                dict(
                    device=name,
                    num_sms=num_sms,
                    l2_bytes=l2,
                    torch=torch.__version__,
                    triton=__import__("triton").__version__,
                    calls=args.calls,
                    replays=args.replays,
                    seconds=elapsed,
                    rows=rows,
                ),
                f,
                indent=1,
            )
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
