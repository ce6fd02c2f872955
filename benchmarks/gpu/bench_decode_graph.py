"""Batch-1 decode of a Qwen3-0.6B-shaped model (random weights) captured in one CUDA graph: time per replay
and kernels per forward, with the fused ops (Triton) and with their PyTorch definitions (the ops before).

``python -m benchmarks.gpu.bench_decode_graph [--backend TRITON_ATTN] [--context 512] [--json OUT]
[--tokenizer-dir DIR]`` on a GPU (DIR: any tokenizer files, where the default model is not installed). The
graph is this script's (the model runner captures its own); it times the model forward, and the forward
plus the LM head. The "pytorch" rows run every fused op's PyTorch definition on CUDA: the same kernels as
before the fused ops, give or take RoPE's copy back into the qkv output instead of a ``torch.cat``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from unittest import mock

import torch


def qwen3_0_6b_dir(tokenizer_dir: str | None = None) -> str:
    """A folder with Qwen3-0.6B's config (and the tokenizer files of ``tokenizer_dir``, if given)."""
    import shutil

    from transformers import Qwen3Config

    cfg = Qwen3Config(
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=40960,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
    )
    cfg.architectures = ["Qwen3ForCausalLM"]
    path = tempfile.mkdtemp(prefix="qwen3-0.6b-")
    cfg.save_pretrained(path)
    if tokenizer_dir:
        shutil.copytree(tokenizer_dir, path, dirs_exist_ok=True)
    return path


def profile_kernels(fn, top: int = 12) -> tuple[int, float, dict[str, tuple[int, float]]]:
    """Kernels one call of ``fn`` launches, their GPU time (ms), and the ``top`` kernel names by GPU time ->
    (launches, GPU microseconds)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by_name: dict[str, tuple[int, float]] = {}
    for e in kernels:
        n, us = by_name.get(e.name[:90], (0, 0.0))
        by_name[e.name[:90]] = (n + 1, us + e.device_time)
    best = dict(sorted(by_name.items(), key=lambda kv: -kv[1][1])[:top])
    return len(kernels), sum(e.device_time for e in kernels) / 1000, best


def time_graph(fn, iters: int = 200) -> float:  # ms per replay
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(20):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def time_eager(fn, iters: int = 50) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="TRITON_ATTN")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--json")
    ap.add_argument("--tokenizer-dir", help="tokenizer files to use where the default model is not installed")
    args = ap.parse_args()

    from attnserve import LLM, SamplingParams
    from attnserve.engine.scheduler import ScheduledRequest, SchedulerOutput
    from attnserve.kernels import fused_ops

    llm = LLM(
        qwen3_0_6b_dir(args.tokenizer_dir),
        load_format="dummy",
        dtype="bfloat16",
        attention_backend=args.backend,
        block_size=16,
        kv_cache_memory=1 << 30,
    )
    runner = llm.engine.runner
    model = runner.model
    ctx = args.context
    req = ScheduledRequest("r", [11], ctx - 1, list(range(-(-ctx // 16))), SamplingParams(max_tokens=1), True)
    batch = runner.prepare(SchedulerOutput(requests=[req]))

    def forward():
        return model(batch.input_ids, batch.positions, batch)

    def forward_logits():
        return model.compute_logits(forward()[batch.logits_indices])

    results = {"backend": runner.backend.name, "context": ctx, "gpu": torch.cuda.get_device_name()}
    with torch.inference_mode():
        for mode in ("fused", "pytorch"):
            # "pytorch": every op takes its PyTorch definition, as the layers did before the fused kernels
            use = (lambda x: None) if mode == "pytorch" else fused_ops._use_triton
            with mock.patch.object(fused_ops, "_use_triton", use):
                forward()  # compiled before profiling
                num, gpu_ms, top = profile_kernels(forward)
                row = {
                    "kernels_per_forward": num,
                    "kernel_time_ms": gpu_ms,
                    "top_kernels_us": top,
                    "eager_forward_ms": time_eager(forward),
                    "graph_forward_ms": time_graph(forward),
                    "graph_forward_logits_ms": time_graph(forward_logits),
                }
                row["logits"] = forward_logits().float()
            results[mode] = row
        a, b = results["fused"].pop("logits"), results["pytorch"].pop("logits")
        results["logits_max_rel_diff"] = float((a - b).abs().max() / b.abs().max())
        results["argmax_equal"] = bool(a.argmax() == b.argmax())
    print(json.dumps(results, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
