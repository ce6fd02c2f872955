"""Where a decode step's time goes: the kernels of one forward pass of a model shape (random weights) at a batch
size and context, their GPU time, and the same forward captured in a CUDA graph (the gap between the two is
launch latency and idle time between kernels).

``python -m benchmarks.gpu.profile_decode [--model benchmarks/shapes/llama-3.1-8b] [--backend FLASHINFER]
[--batch-size 1] [--context 1024] [--use-skinny-gemm] [--json OUT]`` on a GPU. The kernels are those of the
engine's own layers (``LLM(..., load_format="dummy")``); each request's KV blocks are its own.
"""

from __future__ import annotations

import argparse
import json
import re

import torch

from benchmarks.gpu.bench_decode_graph import profile_kernels, time_graph

# kernel-name patterns -> category (first match wins); the rest are "other"
CATEGORIES = [
    ("attention", r"attention|flash|decode|prefill|fwd_kernel|splitkv|combine|merge"),  # FA3 is cutlass
    ("matmul", r"gemm|gemv|nvjet|cutlass|xmma|sm90_|_mm_|matmul|splitKreduce"),
    ("norm", r"norm"),
    ("rope+kv_write", r"rotary_kv_write"),
    ("rope", r"rope|rotary"),
    ("kv_write", r"cache|reshape_and"),
]


def categorize(top: dict[str, tuple[int, float]]) -> dict[str, dict[str, float]]:
    """Launches and GPU microseconds per category of kernel name."""
    out: dict[str, dict[str, float]] = {}
    for name, (n, us) in top.items():
        cat = next((c for c, pat in CATEGORIES if re.search(pat, name, re.I)), "other")
        row = out.setdefault(cat, {"launches": 0, "gpu_us": 0.0})
        row["launches"] += n
        row["gpu_us"] += us
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="benchmarks/shapes/qwen3-0.6b")
    ap.add_argument("--backend", default="FLASH_ATTN")
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--use-skinny-gemm", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()

    bs, ctx = args.batch_size, args.context
    llm, batch = decode_batch(args.model, args.backend, bs, ctx)
    runner = llm.engine.runner
    if args.use_skinny_gemm:  # the runner measures the plan only when it captures graphs (this engine is eager)
        from attnserve.gemv.choices import plan_rows
        from attnserve.gemv.plan import GemvPlan
        from attnserve.model_executor.cuda_graph import capture_sizes

        rows = plan_rows(capture_sizes(max(bs, 8)))  # the buckets a graph engine of this max_num_seqs measures
        runner.gemv_plan = GemvPlan.measure(runner.model, rows).install(runner.model)
    with torch.inference_mode():  # the engine's buffers are inference tensors
        result = _profile(runner, batch)
    result.update(model=args.model, batch_size=bs, context=ctx, skinny_gemm=args.use_skinny_gemm)
    print(json.dumps({k: v for k, v in result.items() if k != "kernels_us"}, indent=1))
    for name, (n, us) in list(result["kernels_us"].items())[:25]:
        print(f"{n:5d} x {us / n:8.2f} us = {us:9.1f} us  {name}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


def decode_batch(model: str, backend: str, bs: int, ctx: int, block: int = 16):
    """An eager engine of ``model``'s shape (random bf16 weights) and the prepared input of one decode step of
    ``bs`` requests at context ``ctx`` (each request's KV blocks its own): ``(llm, batch)``; the engine's
    runner is ``llm.engine.runner`` (keep ``llm``: it owns the runner)."""
    from attnserve import LLM, SamplingParams
    from attnserve.engine.scheduler import ScheduledRequest, SchedulerOutput

    llm = LLM(
        model,
        load_format="dummy",
        dtype="bfloat16",
        attention_backend=backend,
        block_size=block,
        max_model_len=ctx + 16,
        max_num_seqs=max(bs, 8),
        enforce_eager=True,
    )
    runner = llm.engine.runner
    per_req = -(-ctx // block)
    reqs = [
        ScheduledRequest(
            f"r{i}", [11 + i], ctx - 1, list(range(i * per_req, (i + 1) * per_req)), SamplingParams(max_tokens=1), True
        )
        for i in range(bs)
    ]
    assert bs * per_req <= runner.num_blocks, (bs * per_req, runner.num_blocks)
    with torch.inference_mode():  # the engine's buffers are inference tensors
        return llm, runner.prepare(SchedulerOutput(requests=reqs))


def _profile(runner, batch) -> dict:
    """Kernels of one decode step (forward + LM head) of ``batch``, eager, and its time as a CUDA graph."""
    model = runner.model

    def forward():
        return model(batch.input_ids, batch.positions, batch)

    def step():
        return model.compute_logits(forward()[batch.logits_indices])

    step()
    num, gpu_ms, by_name = profile_kernels(step, top=60)
    try:  # the eager metadata of some backends (FLASHINFER's planned wrapper) cannot be captured as is
        graph_ms, graph_error = time_graph(step), None
        in_graph = _profile_replay(step)
    except RuntimeError as e:
        graph_ms, graph_error, in_graph = float("nan"), str(e).splitlines()[0], {}
    return {
        "in_graph": in_graph,
        "backend": runner.backend.name,
        "gpu": torch.cuda.get_device_name(),
        "kernels_per_step": num,
        "kernels_per_layer": round(num / runner.dims.num_layers, 2),
        "kernel_time_ms": gpu_ms,
        "graph_step_ms": graph_ms,
        "graph_error": graph_error,
        "gap_ms": graph_ms - gpu_ms,
        "by_category": categorize(by_name),
        "kernels_us": by_name,
    }


def _profile_replay(step) -> dict:
    """The kernels of one CUDA-graph replay of ``step`` as CUPTI sees them: their summed GPU time, the span from
    the first kernel's start to the last one's end (the difference is idle time between kernels), and the
    summed time per category."""
    from torch.profiler import ProfilerActivity, profile

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    if not kernels:
        return {"kernels": 0}
    by_name: dict[str, tuple[int, float]] = {}
    for e in kernels:
        n, us = by_name.get(e.name[:90], (0, 0.0))
        by_name[e.name[:90]] = (n + 1, us + e.device_time)
    starts = [e.time_range.start for e in kernels]
    ends = [e.time_range.end for e in kernels]
    busy_us = sum(e.device_time for e in kernels)
    return {
        "kernels": len(kernels),
        "busy_ms": busy_us / 1000,
        "span_ms": (max(ends) - min(starts)) / 1000,
        "idle_ms": (max(ends) - min(starts) - busy_us) / 1000,
        "by_category": categorize(by_name),
        "kernels_us": dict(sorted(by_name.items(), key=lambda kv: -kv[1][1])[:40]),
    }


if __name__ == "__main__":
    main()
