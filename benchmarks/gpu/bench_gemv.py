"""Triton GEMV (``attnserve/kernels/triton_gemv.py``) vs cuBLAS (``F.linear``) for decode-sized M (the
CUDA-graph buckets 1, 2, 4, 8, 16, 32, 48, 64) on the linear-layer and LM-head weight shapes of
Llama-3.1-8B and Qwen3-0.6B, bfloat16.

``python -m benchmarks.gpu.bench_gemv [--json OUT] [--models llama qwen] [--ms 1 2 4 8 16 32 48 64] [--budget-s 300]``
on a GPU; ``--dry-run`` checks the script on CPU.

Each time is one CUDA graph of back-to-back calls (20, or more to use every weight copy) cycling through
copies of the weight whose total exceeds twice the L2 cache, so the weight is read from HBM as in a decode
step; CUDA events around 10 replays; microseconds per call (``gemv.timing.time_per_call_us``, the same
harness the start-up plan uses). TB/s counts the weight's bytes only. For each (shape, M): cuBLAS, the
default config, the best of the sweep (``gemv.tiles.sweep_configs``: a few dozen FMA and tensor-core tiles
and split counts) and the best of the start-up plan's candidates (``candidate_configs``: what
``use_skinny_gemm`` would pick from), and the plan's choice: the best candidate where it is at least
``gemv.choices.MARGIN`` (5%) faster than cuBLAS, else cuBLAS. Every config's output is checked against
``F.linear`` (2 ulp plus a float32-sum slack) before it is timed; a config that disagrees is reported and
never counted as best.
Past ``--budget-s`` the remaining shapes time only the default and the candidates (the JSON says so).
Writes every config's time to the JSON for tuning ``default_config`` / ``candidate_configs``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import torch
import torch.nn.functional as F

SHAPES = {  # model -> [(layer, N, K)]
    "llama": [
        ("qkv", 6144, 4096),
        ("o", 4096, 4096),
        ("gate_up", 28672, 4096),
        ("down", 4096, 14336),
        ("lm_head", 128256, 4096),
    ],
    "qwen": [
        ("qkv", 4096, 1024),
        ("o", 1024, 2048),
        ("gate_up", 6144, 1024),
        ("down", 1024, 3072),
        ("lm_head", 151936, 1024),
    ],
}
MODEL_NAMES = {"llama": "Llama-3.1-8B", "qwen": "Qwen3-0.6B"}
NUM_LAYERS = {"Llama-3.1-8B": 32, "Qwen3-0.6B": 28}


def per_layer(rows: list[dict]) -> list[str]:
    """Per (model, M): the four GEMMs of one layer (all but the LM head) with cuBLAS and with the plan's
    choices (us), and what the plan saves per decode step over the model's layers (ms)."""
    lines = []
    for model in dict.fromkeys(r["model"] for r in rows):
        for m in dict.fromkeys(r["m"] for r in rows if r["model"] == model):
            mine = [r for r in rows if r["model"] == model and r["m"] == m and r["layer"] != "lm_head"]
            cublas = sum(r["cublas_us"] for r in mine)
            plan = sum(r["candidate_us"] if r["plan_choice"] != "cuBLAS" else r["cublas_us"] for r in mine)
            saved_ms = (cublas - plan) * NUM_LAYERS[model] / 1e3
            lines.append(
                f"{model:<13} M={m:<2} {len(mine)} GEMMs per layer: cuBLAS {cublas:7.2f} us, plan "
                f"{plan:7.2f} us; x {NUM_LAYERS[model]} layers: {saved_ms:.3f} ms saved per step"
            )
    return lines


def _f(v: float | None, width: int) -> str:
    return f"{v:>{width}.2f}" if v is not None else f"{'-':>{width}}"


def _wall_us(call, weights, calls=1, replays=1) -> float:  # --dry-run's stand-in for the CUDA-graph timing
    t = time.perf_counter()
    call(weights[0])
    return (time.perf_counter() - t) * 1e6


def copy_tbps(device: torch.device, nbytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth (read + write bytes per second), TB/s."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        dst.copy_(src)
    end.record()
    end.synchronize()
    return 2 * nbytes * 10 / (start.elapsed_time(end) * 1e-3) / 1e12


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--models", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    ap.add_argument("--ms", nargs="+", type=int, default=[1, 2, 4, 8, 16, 32, 48, 64])
    ap.add_argument("--budget-s", type=float, default=300.0, help="after this, time only default + candidates")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="check this script on CPU: TRITON_INTERPRET=1, "
        "shapes / 64, wall-clock times of one call (meaningless as timings)",
    )
    args = ap.parse_args()
    if not torch.cuda.is_available() and not args.dry_run:
        raise SystemExit("bench_gemv needs a CUDA GPU")

    from attnserve.gemv.choices import MARGIN
    from attnserve.gemv.tiles import candidate_configs, sweep_configs
    from attnserve.gemv.timing import agrees, l2_bytes, time_per_call_us, weight_copies
    from attnserve.kernels.triton_gemv import default_config, gemv, prepare

    t0 = time.perf_counter()
    if args.dry_run:
        dev, name, num_sms, l2, copy = torch.device("cpu"), "CPU (dry run)", 132, 1 << 20, 0.0
        time_per_call_us = _wall_us  # noqa: F811
        torch.cuda.synchronize = lambda *a: None
        for model in SHAPES:
            SHAPES[model] = [(layer, n // 64, k // 64) for layer, n, k in SHAPES[model]]
    else:
        dev = torch.device("cuda")
        props = torch.cuda.get_device_properties(dev)
        name, num_sms, l2 = props.name, props.multi_processor_count, l2_bytes(dev)
        copy = copy_tbps(dev)
    prepare(dev)
    print(
        f"{name}: {num_sms} SMs, L2 {l2 >> 20} MiB, copy bandwidth {copy:.2f} TB/s; "
        f"torch {torch.__version__}, triton {__import__('triton').__version__}"
    )
    head = (
        f"{'model':<13} {'layer':<8} {'N':>6} {'K':>6} {'M':>2} {'MB':>7} | {'cuBLAS us':>9} {'TB/s':>5} | "
        f"{'default':>7} | {'best us':>8} {'TB/s':>5} {'x cuBLAS':>8} | {'cand us':>7} {'x':>5} | "
        f"{'best config':<24} | plan"
    )
    print(head)
    print("-" * len(head))
    rows, dtype = [], torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    with torch.no_grad():
        for model in args.models:
            for layer, n, k in SHAPES[model]:
                w = torch.randn(n, k, device=dev, dtype=dtype, generator=g) * k**-0.5
                copies = weight_copies(w, 2 * l2)
                mbytes = n * k * 2 / 1e6
                for m in args.ms:
                    x = torch.randn(m, k, device=dev, dtype=dtype, generator=g)
                    want = F.linear(x, w)
                    cublas = time_per_call_us(lambda v: F.linear(x, v), copies, args.calls, args.replays)
                    default = default_config(n, k, m, 2, num_sms)
                    cands = candidate_configs(n, k, m, 2, num_sms)
                    budget_left = time.perf_counter() - t0 < args.budget_s
                    configs = list(
                        dict.fromkeys([default, *cands, *(sweep_configs(n, k, m, 2, num_sms) if budget_left else [])])
                    )
                    timed: list[dict] = []
                    for cfg in configs:
                        entry = dict(config=dataclasses.asdict(cfg), label=cfg.label(), candidate=cfg in cands)
                        try:
                            got = gemv(x, w, None, cfg)
                            torch.cuda.synchronize()
                            entry["agrees"] = agrees(got, want)
                            if entry["agrees"]:
                                entry["us"] = time_per_call_us(
                                    lambda v: gemv(x, v, None, cfg), copies, args.calls, args.replays
                                )
                            else:
                                err = float((got.float() - want.float()).abs().max())
                                entry["max_abs_err"] = err
                                print(
                                    f"  DISAGREES with F.linear: {cfg.label()} on ({n}, {k}) x {m}: max |err| {err:.3g}"
                                )
                        except Exception as e:  # e.g. out of shared memory / registers for this GPU
                            entry["error"] = f"{type(e).__name__}: {e}"[:300]
                        timed.append(entry)
                    ok = [t for t in timed if "us" in t]
                    best = min(ok, key=lambda t: t["us"]) if ok else None
                    best_cand = min((t for t in ok if t["candidate"]), key=lambda t: t["us"], default=None)
                    d_us = next((t.get("us") for t in timed if t["label"] == default.label()), None)
                    row = dict(
                        model=MODEL_NAMES[model],
                        layer=layer,
                        n=n,
                        k=k,
                        m=m,
                        weight_mb=mbytes,
                        cublas_us=cublas,
                        cublas_tbps=n * k * 2 / (cublas * 1e-6) / 1e12,
                        default_us=d_us,
                        best_us=best and best["us"],
                        best_config=best and best["label"],
                        candidate_us=best_cand and best_cand["us"],
                        candidate_config=best_cand and best_cand["label"],
                        swept=budget_left,
                        disagreements=sum(1 for t in timed if t.get("agrees") is False),
                        errors=sum(1 for t in timed if "error" in t),
                        configs=timed,
                    )
                    row["best_tbps"] = best and n * k * 2 / (best["us"] * 1e-6) / 1e12
                    row["speedup"] = best and cublas / best["us"]
                    row["candidate_speedup"] = best_cand and cublas / best_cand["us"]
                    use = best_cand is not None and best_cand["us"] <= (1 - MARGIN) * cublas
                    row["plan_choice"] = best_cand["label"] if use else "cuBLAS"  # what GemvPlan would keep
                    rows.append(row)
                    print(
                        f"{row['model']:<13} {layer:<8} {n:>6} {k:>6} {m:>2} {mbytes:>7.1f} | {cublas:>9.2f} "
                        f"{row['cublas_tbps']:>5.2f} | {_f(d_us, 7)} | {_f(row['best_us'], 8)} "
                        f"{_f(row['best_tbps'], 5)} {_f(row['speedup'], 8)} | "
                        f"{_f(row['candidate_us'], 7)} {_f(row['candidate_speedup'], 5)} | "
                        f"{(row['best_config'] or '-') + ('' if budget_left else ' (no sweep)'):<24} | "
                        f"{row['plan_choice']}",
                        flush=True,
                    )
                del copies, w
                torch.cuda.empty_cache()
    elapsed = time.perf_counter() - t0
    wins = [r for r in rows if r["speedup"] and r["speedup"] >= 1.05]
    print(
        f"\nTriton >= 5% faster than cuBLAS in {len(wins)}/{len(rows)} (shape, M); "
        f"candidates alone in {sum(1 for r in rows if r['candidate_speedup'] and r['candidate_speedup'] >= 1.05)}; "
        f"disagreements {sum(r['disagreements'] for r in rows)}, launch errors {sum(r['errors'] for r in rows)}; "
        f"{elapsed:.1f} s"
    )
    print("\n".join(per_layer(rows)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                dict(
                    device=name,
                    num_sms=num_sms,
                    l2_bytes=l2,
                    copy_tbps=copy,
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
