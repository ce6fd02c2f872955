"""Named inputs for the fused ops, and a runner for their Triton kernels under the Triton interpreter.

``python -m tests.kernels.fused_cases IN OUT`` (with ``TRITON_INTERPRET=1`` set before Triton is imported)
loads the cases saved at IN, runs each through ``attnserve.kernels.triton_fused_ops`` on CPU tensors and
saves the results at OUT: the interpreter mode is fixed when Triton's kernels are decorated, so it runs in
its own process.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import torch

from attnserve.kernels.fused_ops import rms_norm_torch, rotary_embedding_torch, silu_and_mul_torch
from attnserve.layers.rotary import RotaryEmbedding

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def make_cases(device: str = "cpu", dtypes=tuple(DTYPES)) -> dict[str, dict]:
    """Case name -> ``{"op": ..., inputs}``: hidden sizes that are not powers of two (576: the default
    model), head sizes 64/128, GQA and head counts that are not powers of two, q/k as strided views of one
    fused qkv output, unsorted (and repeated) positions, with and without residual / per-head norm."""
    g = torch.Generator().manual_seed(0)

    def randn(*shape, dt, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dt)

    cases: dict[str, dict] = {}
    for name in dtypes:
        dt = DTYPES[name]
        for shape in [(7, 576), (2, 5, 576), (9, 64), (3, 128), (0, 576), (5, 1000)]:
            h = shape[-1]
            for res in (False, True):
                cases[f"rms_norm-{'x'.join(map(str, shape))}-{'res' if res else 'nores'}-{name}"] = dict(
                    op="rms_norm",
                    x=randn(*shape, dt=dt, scale=2.0),
                    weight=randn(h, dt=dt, scale=0.1) + 1,
                    eps=1e-6 if res else 1e-5,
                    residual=randn(*shape, dt=dt) if res else None,
                )
        # the per-head q norm over a strided (T, Hq, D) view, through the generic kernel
        qkv = randn(6, (4 + 2 * 2) * 64, dt=dt)
        cases[f"rms_norm-heads_view-{name}"] = dict(
            op="rms_norm",
            x=qkv[:, :256].view(6, 4, 64),
            weight=randn(64, dt=dt, scale=0.1) + 1,
            eps=1e-6,
            residual=None,
        )
        for d, hq, hk, t in [(64, 8, 2, 11), (128, 16, 8, 5), (128, 12, 3, 4), (64, 4, 4, 1)]:
            rope = RotaryEmbedding(d, 1024, 1e6).to(device)
            positions = torch.randint(0, 1024, (t,), generator=g).to(device)
            positions[-1] = positions[0]  # a repeat; the rest is unsorted
            for norm in (False, True):
                cases[f"rotary-d{d}-q{hq}-kv{hk}-t{t}-{'norm' if norm else 'nonorm'}-{name}"] = dict(
                    op="rotary",
                    positions=positions,
                    qkv=randn(t, (hq + 2 * hk) * d, dt=dt, scale=2.0),
                    hq=hq,
                    hk=hk,
                    d=d,
                    cos=rope.cos_cache,
                    sin=rope.sin_cache,
                    q_norm=(randn(d, dt=dt, scale=0.1) + 1, 1e-6) if norm else None,
                    k_norm=(randn(d, dt=dt, scale=0.1) + 1, 1e-6) if norm else None,
                )
        for t, inter in [(5, 1000), (3, 1536), (1, 3072), (0, 64)]:
            cases[f"silu_and_mul-{t}x{inter}-{name}"] = dict(op="silu_and_mul", x=randn(t, 2 * inter, dt=dt, scale=3.0))
    return cases


def qk_views(case: dict, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The (T, Hq, D) and (T, Hkv, D) views of a case's fused qkv tensor (row stride (Hq + 2 Hkv) D)."""
    t, d, hq, hk = qkv.shape[0], case["d"], case["hq"], case["hk"]
    q, k, _ = qkv.split([hq * d, hk * d, hk * d], dim=-1)
    return q.view(t, hq, d), k.view(t, hk, d)


def run(case: dict, ops) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """One case through ``ops`` (``fused_ops``, ``triton_fused_ops`` or ``TORCH_OPS``);
    in-place ops run on a copy and return the whole qkv tensor (so that v's untouched bytes are checked)."""
    op = case["op"]
    if op == "rms_norm":
        return ops.rms_norm(case["x"], case["weight"], case["eps"], case["residual"])
    if op == "rotary":
        qkv = case["qkv"].clone()
        ops.rotary_embedding(
            case["positions"], *qk_views(case, qkv), case["cos"], case["sin"], case["q_norm"], case["k_norm"]
        )
        return qkv
    return ops.silu_and_mul(case["x"])


# the PyTorch definitions under the dispatchers' names
TORCH_OPS = SimpleNamespace(
    rms_norm=rms_norm_torch, rotary_embedding=rotary_embedding_torch, silu_and_mul=silu_and_mul_torch
)


def main(inp: str, out: str) -> None:
    import triton

    assert triton.knobs.runtime.interpret, "run with TRITON_INTERPRET=1"
    from attnserve.kernels import triton_fused_ops

    cases = torch.load(inp)
    torch.save({name: run(case, triton_fused_ops) for name, case in cases.items()}, out)


if __name__ == "__main__":
    main(*sys.argv[1:3])
