"""Engine-level variants of a decode step, in one process on one engine: TPOT as ``bench latency`` measures it
(``latency.run_engine``), the variants alternated ``--rounds`` times.

``python -m benchmarks.gpu.bench_engine_variants [--model benchmarks/shapes/qwen3-0.6b] [--backend TRITON_ATTN]
[--batch-size 1 64] [--input-len 1024] [--output-len 128] [--rounds 2] [--variants ...] [--json OUT]`` on a GPU.

Variants: ``engine`` (as built), ``in-line copies`` (the graph inputs' copies and the sampled tokens' copy to
the host on the current stream, in line with the step's kernels, instead of on side streams),
``torch argmax`` (the greedy sampler's argmax as ``torch.argmax`` instead of the Triton kernel),
``no direct decode`` (TRITON_ATTN's decode calls load their tile arrays: ``triton_attention.DECODE_DIRECT``
off; takes effect in graphs captured after it is set, so this variant re-captures), ``no greedy head`` (greedy
steps compute the logits and take their argmax instead of the fused greedy head where the GEMV plan chose it;
the plan's greedy rows are printed and saved), ``no whole-K tiles`` (the GEMV plan measured again without
``gemv.tiles.whole_k_config``'s one-step tiles among its candidates, applied, graphs re-captured), ``no unsplit
tile`` (likewise without ``gemv.tiles.UNSPLIT_WIDE_TILE``), ``no SwiGLU epilogue`` (the engine's plan without its
gate/up SwiGLU table: gate/up, then ``silu_and_mul``). Correctness
of each: ``tests/gpu/test_async_scheduling_gpu.py``, ``test_cuda_graphs.py``, ``test_triton_argmax_gpu.py``, ``test_greedy_head_gpu.py``.
"""

from __future__ import annotations

import argparse
import json

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="benchmarks/shapes/qwen3-0.6b")
    ap.add_argument("--backend", default="TRITON_ATTN")
    ap.add_argument("--batch-size", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--input-len", type=int, default=1024)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--variants", nargs="+", default=["engine", "in-line copies", "torch argmax", "no direct decode"])
    ap.add_argument("--json")
    args = ap.parse_args()

    from attnserve import LLM
    from attnserve.benchmarks.latency import run_engine
    from attnserve.benchmarks.roofline import Roofline, kv_bytes_per_token, measure_copy_bandwidth

    device = torch.device("cuda")
    bandwidth = measure_copy_bandwidth(device)
    llm = LLM(
        args.model,
        load_format="dummy",
        dtype="bfloat16",
        attention_backend=args.backend,
        max_model_len=4096,
        max_num_seqs=max(args.batch_size),
        max_num_batched_tokens=65536,
        use_skinny_gemm=True,
    )
    engine = llm.engine
    info = engine.info
    roofline = Roofline(
        copy_bandwidth=bandwidth,
        weight_bytes=info.weight_bytes,
        kv_bytes_per_token=kv_bytes_per_token(info.num_layers, info.num_kv_heads, info.head_size, info.kv_dtype),
    )
    runner = engine.runner
    graphs, sampler = runner.cuda_graphs, runner.sampler
    side_input_stream = graphs.input_stream
    from attnserve.kernels import triton_attention
    from attnserve.model_executor import sampler as sampler_module

    triton_argmax_rows = sampler_module.argmax_rows
    from attnserve.model_executor.greedy_head import GreedyHead

    plan = runner.gemv_plan
    greedy_plan = (
        [
            dict(
                m=m,
                unfused_us=c.unfused_us,
                unfused=c.unfused_label,
                fused_us=c.fused_us,
                config=c.config.label() if c.config else None,
                use_fused=c.use_fused,
            )
            for m, c in sorted(plan.greedy.items())
        ]
        if plan is not None
        else []
    )
    for row in greedy_plan:
        print(f"greedy head plan: {row}", flush=True)

    plans, state = {"engine": plan}, {"plan": "engine"}
    if plan is not None:
        import dataclasses

        from attnserve.gemv import tiles as gemv_tiles
        from attnserve.gemv.choices import plan_rows
        from attnserve.gemv.plan import GemvPlan
        from attnserve.model_executor.cuda_graph import capture_sizes

        print(f"engine plan:\n{plan.summary()}", flush=True)
        for variant, attr, off in [
            ("no whole-K tiles", "whole_k_config", lambda n, k, m: None),
            ("no unsplit tile", "UNSPLIT_WIDE_TILE", None),
        ]:
            if variant in args.variants:
                kept = getattr(gemv_tiles, attr)
                setattr(gemv_tiles, attr, off)
                try:
                    plans[variant] = GemvPlan.measure(runner.model, plan_rows(capture_sizes(max(args.batch_size))))
                finally:
                    setattr(gemv_tiles, attr, kept)
                print(f"plan for {variant}:\n{plans[variant].summary()}", flush=True)
        plans["no SwiGLU epilogue"] = dataclasses.replace(plan, swiglu={})
        plan.install(runner.model)

    def use(name: str) -> None:
        graphs.input_stream = None if name == "in-line copies" else side_input_stream
        if name == "in-line copies":
            sampler._host_copy_stream = lambda dev: torch.cuda.current_stream(dev)
        else:
            sampler.__dict__.pop("_host_copy_stream", None)
        sampler_module.argmax_rows = (lambda x: x.argmax(dim=-1)) if name == "torch argmax" else triton_argmax_rows
        direct = name != "no direct decode"
        plan_name = name if name in plans else "engine"
        if triton_attention.DECODE_DIRECT != direct or plan_name != state["plan"]:
            triton_attention.DECODE_DIRECT = direct
            if plan_name != state["plan"]:
                plans[plan_name].install(runner.model)
                state["plan"] = plan_name
            graphs.graphs.clear()
            graphs.capture()
        installed = plans[state["plan"]]
        runner.greedy_head = GreedyHead(
            None if name == "no greedy head" or installed is None else installed.greedy_head
        )

    vocab = runner.dims.vocab_size
    rows = []
    for r in range(args.rounds):
        for name in args.variants:
            use(name)
            for b in args.batch_size:
                row = run_engine(engine, b, args.input_len, args.output_len, 2, 1, vocab, 0, roofline)
                d = row.to_dict()
                rows.append(
                    {
                        "variant": name,
                        "round": r,
                        "batch_size": b,
                        "tpot_ms": d["tpot_s"]["mean"] * 1e3,
                        "pct_of_limit": d["roofline"]["pct_of_limit"],
                    }
                )
                print(
                    f"{name:17s} b{b:<3d} TPOT {rows[-1]['tpot_ms']:.4f} ms  {rows[-1]['pct_of_limit']:.1f}% of limit",
                    flush=True,
                )
    use("engine")
    out = {
        "model": args.model,
        "backend": args.backend,
        "copy_bandwidth": bandwidth,
        "greedy_plan": greedy_plan,
        "gpu": torch.cuda.get_device_name(),
        "rows": rows,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
