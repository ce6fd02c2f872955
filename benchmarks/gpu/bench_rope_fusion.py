"""TRITON_ATTN's decode step with RoPE (+ q/k norm) and the KV write inside the attention kernel against the
two-kernel path (the RoPE + KV-write kernel, then attention), in one process on one engine: ms per step, one
CUDA graph per variant, the variants alternated ``--rounds`` times, and whether the logits are the same bits.
A third variant loads the decode call's tile arrays as a mixed batch's calls do (``triton_attention.DECODE_DIRECT``
off).

``python -m benchmarks.gpu.bench_rope_fusion [--model benchmarks/shapes/qwen3-0.6b] [--batch-size 64]
[--context 1024] [--rounds 2] [--json OUT]`` on a GPU. The step is ``profile_decode.decode_batch``'s (random
weights, each request's own KV blocks); "two kernels" makes ``TritonAttentionImpl.forward_with_rope`` decline
(return None), so ``Attention.forward_with_rope`` runs what it ran before the fusion.
"""

from __future__ import annotations

import argparse
import json

import torch

from benchmarks.gpu.bench_decode_graph import time_graph
from benchmarks.gpu.profile_decode import decode_batch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="benchmarks/shapes/qwen3-0.6b")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args()

    from attnserve.attention.backends.triton_attn import TritonAttentionImpl

    llm, batch = decode_batch(args.model, "TRITON_ATTN", args.batch_size, args.context)
    model = llm.engine.runner.model
    fused = TritonAttentionImpl.forward_with_rope

    def declined(self, *args, **kwargs):
        return None

    def step():
        return model.compute_logits(model(batch.input_ids, batch.positions, batch)[batch.logits_indices])

    from attnserve.kernels import triton_attention

    rows, base = [], None
    with torch.inference_mode():
        for _ in range(args.rounds):
            for name, impl, direct in (
                ("fused", fused, True),
                ("two kernels", declined, True),
                ("fused, tile arrays loaded", fused, False),
            ):
                TritonAttentionImpl.forward_with_rope = impl
                triton_attention.DECODE_DIRECT = direct
                logits = step().float()
                ms = time_graph(step)
                base = logits if base is None else base
                rows.append({"variant": name, "ms": ms, "logits_equal_fused": bool(torch.equal(logits, base))})
                print(f"{name:26s} {ms:8.4f} ms  equal={rows[-1]['logits_equal_fused']}", flush=True)
    TritonAttentionImpl.forward_with_rope = fused
    triton_attention.DECODE_DIRECT = True
    out = {
        "model": args.model,
        "batch_size": args.batch_size,
        "context": args.context,
        "gpu": torch.cuda.get_device_name(),
        "rows": rows,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
