"""Named inputs for the fused RoPE + KV-cache write, and a runner for its Triton kernels under the Triton
interpreter (``python -m tests.kernels.rope_kv_cases IN OUT`` with ``TRITON_INTERPRET=1``; see
``fused_cases.py`` for why it is a process of its own).

Each case runs two ways, each on its own copy of the fused qkv output and of the cache: ``fused`` (the one
kernel, ``rotary_embedding_kv_write``) and ``two`` (``_rope_kernel``, then ``reshape_and_cache`` reading
k back), returning ``(qkv, *caches)`` after each. ``caches`` is one backend-shaped cache, or (for a case
where keys and values have different strides) a key and a value cache ``(N, B, H, D)``.
"""

from __future__ import annotations

import sys

import torch

from attnserve.attention.backend import KVCacheLayout
from attnserve.kernels.kv_write import KVWriteTarget, kv_views
from attnserve.layers.rotary import RotaryEmbedding
from attnserve.model_executor.kv_cache import allocate_kv_caches

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class _Shape2N:
    """A backend's cache facts, as ``allocate_kv_caches`` reads them: ``(2, N, B, H, D)`` (FLASH_ATTN, FLEX)."""

    kv_dim = 0
    get_kv_cache_shape = staticmethod(lambda n, b, h, d: (2, n, b, h, d))

    @staticmethod
    def get_kv_cache_stride_order(layout):
        return (0, 1, 3, 2, 4) if layout == KVCacheLayout.HND else (0, 1, 2, 3, 4)


class _ShapeN2(_Shape2N):
    """``(N, 2, B, H, D)`` (TRITON_ATTN, FLASHINFER)."""

    kv_dim = 1
    get_kv_cache_shape = staticmethod(lambda n, b, h, d: (n, 2, b, h, d))


CACHE_SHAPES = {"2N": _Shape2N, "N2": _ShapeN2}


def make_cases(device: str = "cpu") -> dict[str, dict]:
    """Case name -> inputs: head sizes 64/128, GQA and head counts that are not powers of two, q/k/v as
    strided views of one fused qkv output, unsorted positions, slots in random blocks with some -1 (padding),
    with and without Qwen3's q/k norm, every dtype; then every cache shape and memory order, and fp8 caches
    with per-tensor scales, on one head configuration."""
    g = torch.Generator().manual_seed(0)

    def randn(*shape, dt, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dt)

    def case(d, hq, hk, t, dt, norm, shape="2N", layout=KVCacheLayout.NHD, fp8=None, page=16):
        rope = RotaryEmbedding(d, 1024, 1e6).to(device)
        num_blocks = t // page + 3
        cache_dt = fp8 or dt
        if shape == "split":  # keys NHD, values HND: a kernel that mixes up K and V strides fails here
            caches = (
                torch.empty(num_blocks, page, hk, d, dtype=cache_dt, device=device),
                torch.empty(num_blocks, hk, page, d, dtype=cache_dt, device=device).transpose(1, 2),
            )
        else:
            caches = tuple(
                allocate_kv_caches(
                    CACHE_SHAPES[shape], layout, 1, num_blocks, page, hk, d, cache_dt, torch.device(device)
                )
            )
        for c in caches:  # junk that a skipped slot must keep
            c.copy_(torch.randn(c.shape, generator=g).to(cache_dt))
        slots = torch.randperm(num_blocks * page, generator=g)[:t]
        slots[torch.arange(t) % 4 == 2] = -1  # padding tokens: rotated, not stored
        return dict(
            positions=torch.randint(0, 1024, (t,), generator=g).to(device),
            qkv=randn(t, (hq + 2 * hk) * d, dt=dt, scale=2.0),
            hq=hq,
            hk=hk,
            d=d,
            cos=rope.cos_cache,
            sin=rope.sin_cache,
            q_norm=(randn(d, dt=dt, scale=0.1) + 1, 1e-6) if norm else None,
            k_norm=(randn(d, dt=dt, scale=0.1) + 1, 1e-6) if norm else None,
            caches=caches,
            kv_dim=CACHE_SHAPES.get(shape, _Shape2N).kv_dim,
            slots=slots.to(device),
            k_scale=10.0 / 448.0 if fp8 else 1.0,
            v_scale=12.0 / 448.0 if fp8 else 1.0,
        )

    cases: dict[str, dict] = {}
    for name, dt in DTYPES.items():
        for d, hq, hk, t in [(64, 8, 2, 11), (128, 16, 8, 5), (128, 12, 3, 4), (64, 4, 4, 1), (128, 64, 8, 3)]:
            for norm in (False, True):
                cases[f"d{d}-q{hq}-kv{hk}-t{t}-{'norm' if norm else 'nonorm'}-{name}"] = case(d, hq, hk, t, dt, norm)
    for shape in CACHE_SHAPES:
        for layout in KVCacheLayout:
            for norm in (False, True):
                cases[f"cache{shape}-{layout.value}-{'norm' if norm else 'nonorm'}-bf16"] = case(
                    128, 12, 3, 37, torch.bfloat16, norm, shape, layout
                )
    cases["cachesplit-nonorm-fp16"] = case(64, 8, 2, 21, torch.float16, False, "split")
    for name in ("bf16", "fp16"):
        for shape, layout in (("2N", KVCacheLayout.NHD), ("N2", KVCacheLayout.HND), ("split", None)):
            cases[f"fp8-cache{shape}-{getattr(layout, 'value', 'mixed')}-norm-{name}"] = case(
                64, 8, 2, 21, DTYPES[name], True, shape, layout, fp8=torch.float8_e4m3fn
            )
    return cases


def views(case: dict, qkv: torch.Tensor, caches: tuple[torch.Tensor, ...]):
    """(q (T, Hq, D), k, v (T, Hkv, D)) views of the fused qkv tensor, and the case's KVWriteTarget on
    ``caches`` (shaped as the case's ``caches``)."""
    t, d, hq, hk = qkv.shape[0], case["d"], case["hq"], case["hk"]
    q, k, v = qkv.split([hq * d, hk * d, hk * d], dim=-1)
    kv = kv_views(caches[0], case["kv_dim"]) if len(caches) == 1 else caches
    target = KVWriteTarget(*kv, case["slots"], case["k_scale"], case["v_scale"])
    return q.view(t, hq, d), k.view(t, hk, d), v.view(t, hk, d), target


def run(case: dict, how: str) -> tuple[torch.Tensor, ...]:
    """One case, on copies: ``fused`` / ``two`` (Triton kernels, see the module docstring) or ``torch``
    (``rotary_embedding_torch``, then ``write_kv_torch``). Returns the whole qkv tensor and the whole caches."""
    qkv, caches = case["qkv"].clone(), tuple(c.clone() for c in case["caches"])  # clone keeps the strides
    q, k, v, target = views(case, qkv, caches)
    args = (case["positions"], q, k)
    rope = (case["cos"], case["sin"], case["q_norm"], case["k_norm"])
    if how == "fused":
        from attnserve.kernels.triton_fused_ops import rotary_embedding_kv_write

        rotary_embedding_kv_write(*args, v, case["cos"], case["sin"], target, case["q_norm"], case["k_norm"])
    elif how == "two":
        from attnserve.kernels.triton_kv_write import reshape_and_cache
        from attnserve.kernels.triton_fused_ops import rotary_embedding

        rotary_embedding(*args, *rope)
        reshape_and_cache(
            k, v, target.key_cache, target.value_cache, target.slot_mapping, target.k_scale, target.v_scale
        )
    else:
        from attnserve.kernels.kv_write import write_kv_torch
        from attnserve.kernels.fused_ops import rotary_embedding_torch

        rotary_embedding_torch(*args, *rope)
        write_kv_torch(k, v, target.key_cache, target.value_cache, target.slot_mapping, target.k_scale, target.v_scale)
    return (qkv, *caches)


def main(inp: str, out: str) -> None:
    import triton

    assert triton.knobs.runtime.interpret, "run with TRITON_INTERPRET=1"
    cases = torch.load(inp)
    torch.save({name: {how: run(case, how) for how in ("fused", "two")} for name, case in cases.items()}, out)


if __name__ == "__main__":
    main(*sys.argv[1:3])
