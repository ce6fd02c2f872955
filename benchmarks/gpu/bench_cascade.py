"""GEMV tiles whose one K step is a program's whole weight share, forced onto a decode step's layers, in one
process: one CUDA graph per variant, variants alternated over ``--rounds``, each one's ms per step, its ratio
to the first (the GEMV plan, PDL on: the engine as built) and its logits against that first's.

``python -m benchmarks.gpu.bench_cascade [--model benchmarks/shapes/llama-3.1-8b] [--backend TRITON_ATTN]
[--batch-size 1] [--context 1024] [--rounds 2] [--json OUT]`` on a GPU of compute capability >= 9.0.

A config whose one K step is the program's whole share (``block_k`` = K per split) issues all of its
weight loads at once, before the PDL wait where K divides evenly. Variants: ``plan`` (the engine as built),
then ``<set>``: the plan with the layers of ``PRELOAD_SETS[set]`` forced, at the batch's row count, to the
given configs. Also per shape: each config alone (a graph of back-to-back calls over weight copies past 2x
L2, PDL on) against cuBLAS and the plan's choice. Session 11 (commit 5146041) also tried "early" PDL here
(each Triton kernel letting the next launch before its own wait): 4.531 vs 4.449 ms, dropped.
"""

from __future__ import annotations

import argparse
import functools
import json

import torch
import torch.nn.functional as F

from benchmarks.gpu.bench_decode_graph import time_graph
from benchmarks.gpu.profile_decode import decode_batch

# GemvConfig arguments (block_n, block_k, split_k, num_warps) per (N, K) name; block_k * split_k = K, so
# each program's one step is its whole share of the weight
PRELOAD = {
    "n4k4096w8": (4, 4096, 1, 8),
    "n2k4096w4": (2, 4096, 1, 4),
    "n8k2048w8": (8, 2048, 2, 8),
    "n4k2048w4": (4, 2048, 2, 4),
    "n2k2048w2": (2, 2048, 2, 2),
    "n4k1024w4": (4, 1024, 4, 4),
}
DOWN_PRELOAD = {
    "n4k2048w4": (4, 2048, 7, 4),
    "n2k2048w2": (2, 2048, 7, 2),
    "n8k2048w8": (8, 2048, 7, 8),
    "n2k16384w16": (2, 16384, 1, 16),
    "n1k16384w8": (1, 16384, 1, 8),
    "n2k8192w8": (2, 8192, 1, 8),
    "n1k8192w4": (1, 8192, 1, 4),
    "n2k4096w4": (2, 4096, 1, 4),
    "n4k4096w8": (4, 4096, 1, 8),
    "n2k2048w4": (2, 2048, 1, 4),
}
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
PRELOAD_SETS = {
    "qkv+o:n2k4096w4": {"qkv": "n2k4096w4", "o": "n2k4096w4"},
    "all:n2k4096w4": {"qkv": "n2k4096w4", "o": "n2k4096w4", "gate_up": "n2k4096w4", "down": "n2k16384w16"},
    "all:n2k4096w4,down:n1k16384w8": {
        "qkv": "n2k4096w4",
        "o": "n2k4096w4",
        "gate_up": "n2k4096w4",
        "down": "n1k16384w8",
    },
}


def config_for(shape: str, name: str):
    from attnserve.kernels.triton_gemv import GemvConfig

    bn, bk, split, warps = (DOWN_PRELOAD if shape == "down" else PRELOAD)[name]
    return GemvConfig(bn, bk, split, num_warps=warps, num_stages=1, dot=False)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="benchmarks/shapes/llama-3.1-8b")
    ap.add_argument("--backend", default="TRITON_ATTN")
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--sets", nargs="*", default=list(PRELOAD_SETS))
    ap.add_argument("--json")
    args = ap.parse_args()

    from attnserve.kernels import pdl
    from attnserve.gemv.choices import MAX_ROWS, plan_rows
    from attnserve.gemv.methods import GemvLinearMethod
    from attnserve.gemv.plan import GemvPlan, gemv_layers
    from attnserve.gemv.timing import l2_bytes, time_per_call_us, weight_copies
    from attnserve.kernels.triton_gemv import gemv, prepare
    from attnserve.model_executor.cuda_graph import capture_sizes

    llm, batch = decode_batch(args.model, args.backend, args.batch_size, args.context)
    model = llm.engine.runner.model
    device = next(model.parameters()).device
    prepare(device)
    rows = args.batch_size
    pdl.configure(True)
    plan = GemvPlan.measure(model, plan_rows(capture_sizes(max(rows, 8)))).install(model)
    print(plan.summary(), flush=True)
    base_methods = {id(m): m.__dict__.get("quant_method") for m, _ in gemv_layers(model)}  # None: the plain one
    by_shape: dict[tuple[int, int], list] = {}
    for m, w in gemv_layers(model):
        by_shape.setdefault(tuple(w.shape), []).append(m)

    def step():
        return model.compute_logits(model(batch.input_ids, batch.positions, batch)[batch.logits_indices])

    def force(preload_set: dict[str, str] | None) -> None:
        for m, _ in gemv_layers(model):
            if base_methods[id(m)] is None:
                m.__dict__.pop("quant_method", None)
            else:
                m.quant_method = base_methods[id(m)]
        for shape, name in (preload_set or {}).items():
            f = functools.partial(gemv, config=config_for(shape, name))
            for m in by_shape.get(SHAPES[shape], []):
                base = m.__dict__.get("quant_method")
                table = list(base.table) if base is not None else [None] * (MAX_ROWS + 1)
                table[rows] = f
                m.quant_method = GemvLinearMethod(tuple(table))

    # each forced config alone, against cuBLAS and the plan's choice
    alone = []
    with torch.inference_mode():
        for shape, (n, k) in SHAPES.items():
            if (n, k) not in by_shape:
                continue
            w0 = by_shape[(n, k)][0].weight
            copies = weight_copies(w0, 2 * l2_bytes(device))
            x = torch.randn(rows, k, device=device, dtype=w0.dtype)
            want = F.linear(x, copies[0])
            row = {"shape": shape, "n": n, "k": k, "cublas_us": time_per_call_us(lambda w: F.linear(x, w), copies)}
            planned = plan.choices.get((n, k, rows))
            row["plan"] = planned.config.label() if planned and planned.use_triton else "cublas/lt"
            for name in DOWN_PRELOAD if shape == "down" else PRELOAD:
                cfg = config_for(shape, name)
                try:
                    got = gemv(x, copies[0], None, cfg)
                    err = float((got.float() - want.float()).abs().max())
                    us = time_per_call_us(lambda w: gemv(x, w, None, cfg), copies)
                except Exception as e:  # noqa: BLE001 - reported, the others still run
                    us, err = float("nan"), f"{type(e).__name__}: {str(e)[:200]}"
                row[f"{name}_us"], row[f"{name}_maxdiff"] = us, err
            alone.append(row)
            print({k2: (round(v, 2) if isinstance(v, float) else v) for k2, v in row.items()}, flush=True)
            del copies

    variants = [("plan", None)] + [(s, s) for s in args.sets]
    results, base_logits = [], None
    base_ms: dict[int, float] = {}
    with torch.inference_mode():
        for r in range(args.rounds):
            for name, set_name in variants:
                force(PRELOAD_SETS[set_name] if set_name else None)
                try:
                    logits = step().float()
                    ms = time_graph(step)
                except Exception as e:  # noqa: BLE001 - a variant that fails is reported, the others still run
                    print(f"!! {name}: {type(e).__name__}: {str(e).splitlines()[0][:300]}", flush=True)
                    results.append({"variant": name, "round": r, "error": f"{type(e).__name__}: {str(e)[:500]}"})
                    continue
                if base_logits is None:
                    base_logits = logits
                base_ms.setdefault(r, ms)
                row = {
                    "variant": name,
                    "round": r,
                    "ms": ms,
                    "ratio": ms / base_ms[r],
                    "logits_equal_base": bool(torch.equal(logits, base_logits)),
                    "logits_max_diff": float((logits - base_logits).abs().max()),
                }
                results.append(row)
                print(
                    f"r{r} {name:28s} {ms:8.4f} ms  x{row['ratio']:.4f}  equal={row['logits_equal_base']} "
                    f"maxdiff={row['logits_max_diff']:.3g}",
                    flush=True,
                )
    pdl.configure(False)
    out = {
        "model": args.model,
        "backend": args.backend,
        "batch_size": rows,
        "context": args.context,
        "gpu": torch.cuda.get_device_name(),
        "alone": alone,
        "variants": results,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
