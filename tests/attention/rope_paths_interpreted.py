"""TRITON_ATTN's step both ways (``tests.gpu.cases.run_rope_paths``) under the Triton interpreter, with the
CUDA dispatch forced onto CPU tensors: RoPE, the KV write, the fused RoPE + KV write and the attention all
run as the Triton kernels they are on a GPU (a decode step's fused path: RoPE and the KV write inside the
attention kernel).

``python -m tests.attention.rope_paths_interpreted IN OUT`` with ``TRITON_INTERPRET=1`` (the interpreter mode
is fixed when Triton's kernels are decorated, hence a process of its own): IN holds ``{name: (case fields,
qk_norm)}``, OUT gets ``{name: results}``.
"""

from __future__ import annotations

import sys

import torch

from tests.gpu.cases import Case, run_rope_paths

# name -> (Case fields, qk_norm): decode, prefill and mixed steps, bf16 and an fp8 cache with scales, both
# KV-cache memory orders
PATH_CASES = {
    f"{shape}-{dt}{'-kvfp8' if fp8 else ''}-{layout}-{'qk_norm' if norm else 'rope'}": (
        dict(
            shape=shape,
            num_heads=8,
            num_kv_heads=2,
            head_size=32,
            dtype=getattr(torch, dt),
            kv_cache_dtype="fp8" if fp8 else "auto",
            layout=layout,
        ),
        norm,
    )
    for shape, dt, fp8, layout, norm in [
        ("decode_b64", "bfloat16", False, "NHD", False),
        ("decode_b64", "bfloat16", False, "NHD", True),
        ("prefill", "float16", False, "NHD", True),
        ("mixed", "bfloat16", False, "HND", True),
        ("mixed", "bfloat16", True, "NHD", True),
        ("decode_b64", "float32", True, "HND", False),
    ]
}


def bits(x: torch.Tensor) -> torch.Tensor:
    """``x``'s bytes (fp8 included, which ``torch.equal`` does not compare everywhere)."""
    return x.contiguous().view(torch.uint8)


def force_triton_dispatch() -> list[str]:
    """Route the CUDA-only dispatch of RoPE and of the KV write to the Triton kernels for any tensor; returns
    a list that records the name of each Triton op run."""
    from attnserve.attention.backends import triton_attn
    from attnserve.kernels import triton_kv_write
    from attnserve.kernels import kv_write
    from attnserve.kernels import triton_fused_ops
    from attnserve.kernels import fused_ops

    ran: list[str] = []

    class Ops:  # triton_fused_ops, recording the calls
        def __getattr__(self, name):
            ran.append(name)
            return getattr(triton_fused_ops, name)

    fused_ops._use_triton = lambda x: Ops()

    def write_kv(key, value, key_cache, value_cache, slot_mapping, k_scale=1.0, v_scale=1.0):
        ran.append("reshape_and_cache")
        triton_kv_write.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale)

    kv_write.write_kv = triton_attn.write_kv = write_kv
    return ran


def main(inp: str, out: str) -> None:
    import triton

    from attnserve.attention.backend import KVCacheLayout
    from attnserve.attention.backends.triton_attn import TritonAttentionBackend

    assert triton.knobs.runtime.interpret, "run with TRITON_INTERPRET=1"
    ran = force_triton_dispatch()
    results = {}
    for name, (fields, qk_norm) in torch.load(inp).items():
        case = Case(**{**fields, "layout": KVCacheLayout(fields["layout"])})
        ran.clear()
        res = run_rope_paths(TritonAttentionBackend, case, "cpu", qk_norm=qk_norm, small=True)
        # unfused: rotary_embedding + reshape_and_cache; fused: rotary_embedding_kv_write alone, or for a
        # decode step (one program per request and KV head here) nothing: the attention kernel does it all
        fused = [] if case.shape.startswith("decode") else ["rotary_embedding_kv_write"]
        res["triton_ops_ran"] = ran == ["rotary_embedding", "reshape_and_cache", *fused]
        results[name] = res
    torch.save(results, out)


if __name__ == "__main__":
    main(*sys.argv[1:3])
