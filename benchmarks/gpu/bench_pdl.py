"""Programmatic dependent launch (``attnserve/kernels/pdl.py``) on a decode step, in one process: the same model
shape, batch and KV cache, one CUDA graph per variant, each variant's ms per step and its ratio to the first
(PDL off, the GEMV plan as ``--use-skinny-gemm`` measures it), and whether its logits equal that baseline's.

``python -m benchmarks.gpu.bench_pdl [--model benchmarks/shapes/llama-3.1-8b] [--backend FLASH_ATTN]
[--batch-size 1] [--context 1024] [--json OUT]`` on a GPU of compute capability >= 9.0.

Variants (name: GEMV choice, PDL):
- ``plan``: the plan measured without PDL; PDL off (today's engine with ``--use-skinny-gemm``);
- ``plan+pdl``: the same choices, PDL on (the same kernels: logits must be bitwise equal to ``plan``'s);
- ``pdlplan+pdl``: the plan measured with PDL on (its timing chains of one GEMV then see PDL too);
- ``triton`` / ``triton+pdl``: the Triton GEMV wherever a candidate runs (margin -10);
- ``cublas+pdl``: no GEMV plan (cuBLAS), PDL on for the small kernels only.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from benchmarks.gpu.bench_decode_graph import time_graph
from benchmarks.gpu.profile_decode import _profile_replay, decode_batch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="benchmarks/shapes/llama-3.1-8b")
    ap.add_argument("--backend", default="FLASH_ATTN")
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--profile", action="store_true", help="also the kernel timeline of each graph replay")
    ap.add_argument("--json")
    args = ap.parse_args()

    from attnserve.kernels import pdl
    from attnserve.gemv.choices import plan_rows
    from attnserve.gemv.plan import GemvPlan, gemv_layers, swiglu_mlps
    from attnserve.model_executor.cuda_graph import capture_sizes

    llm, batch = decode_batch(args.model, args.backend, args.batch_size, args.context)
    model = llm.engine.runner.model
    rows = plan_rows(capture_sizes(max(args.batch_size, 8)))

    def step():
        return model.compute_logits(model(batch.input_ids, batch.positions, batch)[batch.logits_indices])

    plans: dict[str, GemvPlan | None] = {}

    def use(plan_name: str | None, pdl_on: bool) -> None:
        pdl.configure(pdl_on)
        if plan_name is None:
            for m, _ in gemv_layers(model):  # back on each class's plain method
                m.__dict__.pop("quant_method", None)
            for mlp in swiglu_mlps(model):
                mlp.__dict__.pop("mlp_method", None)
            return
        if plan_name not in plans:
            t0 = time.perf_counter()
            plans[plan_name] = GemvPlan.measure(model, rows, margin=-10.0 if plan_name == "triton" else None)
            print(f"plan {plan_name}: {time.perf_counter() - t0:.1f} s\n{plans[plan_name].summary()}", flush=True)
        plans[plan_name].install(model)

    variants = [
        ("plan", "plan", False),
        ("plan+pdl", "plan", True),
        ("pdlplan+pdl", "pdlplan", True),
        ("triton", "triton", False),
        ("triton+pdl", "triton", True),
        ("cublas+pdl", None, True),
    ]
    results, base_logits, base_ms = [], None, None
    with torch.inference_mode():
        for name, plan_name, pdl_on in variants:
            use(plan_name, pdl_on)  # a plan measured here times its GEMVs with this variant's PDL setting
            try:
                logits = step().float()
                ms = time_graph(step)
                row = {"variant": name, "ms": ms, "pdl": pdl_on}
                if args.profile:
                    row["in_graph"] = {k: v for k, v in _profile_replay(step).items() if k != "kernels_us"}
            except Exception as e:  # a variant that fails is reported, the others still run
                print(f"!! {name}: {type(e).__name__}: {str(e).splitlines()[0][:300]}", flush=True)
                results.append({"variant": name, "error": f"{type(e).__name__}: {str(e)[:500]}"})
                continue
            if base_logits is None:
                base_logits, base_ms = logits, ms
            row["ratio"] = ms / base_ms
            row["logits_equal_base"] = bool(torch.equal(logits, base_logits))
            row["logits_max_diff"] = float((logits - base_logits).abs().max())
            results.append(row)
            print(
                f"{name:22s} {ms:8.4f} ms  x{row['ratio']:.3f}  equal={row['logits_equal_base']} "
                f"maxdiff={row['logits_max_diff']:.3g}",
                flush=True,
            )
    pdl.configure(False)
    out = {
        "model": args.model,
        "backend": args.backend,
        "batch_size": args.batch_size,
        "context": args.context,
        "gpu": torch.cuda.get_device_name(),
        "variants": results,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
