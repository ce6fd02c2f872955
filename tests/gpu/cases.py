"""Named batch shapes for checking attention backends against the reference, and the check itself.

A case is a list of requests ``(context_len, query_len)``: ``context_len`` tokens already in the paged
cache, ``query_len`` new tokens this step (decodes first, as the scheduler orders them). The check fills
the context into a cache of the backend's shape (block tables in random order, unused blocks holding
random finite values), runs the backend's builder and impl (which write this step's K/V), and compares
with ``reference_paged_attention`` over the same cache, dequantized when it is fp8.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import Any

import torch

from attnserve.attention.backend import AttentionLayerSpec, CommonAttentionMetadata, KVCacheLayout
from attnserve.attention.kv_cache_dtype import kv_cache_torch_dtype
from attnserve.kernels.kv_write import kv_views, write_kv_torch
from attnserve.kernels.reference import reference_paged_attention

SHAPES: dict[str, list[tuple[int, int]]] = {
    "decode_b1_ctx1": [(0, 1)],
    "decode_b1_ctx8k": [(8191, 1)],
    "decode_b64": None,  # 64 decodes, context 1..8k (filled in by shape())
    "prefill": [(0, 1), (0, 17), (0, 300), (0, 700)],
    "mixed": [(5, 1), (100, 1), (1000, 1), (3000, 1), (64, 37), (500, 200), (0, 129)],
}

# (relative error bound) per dtype: max |out - ref| / max |ref|
TOLERANCE = {torch.float32: 2e-4, torch.float16: 5e-3, torch.bfloat16: 2.5e-2, "fp8": 8e-2}
# the step's K/V read back from an fp8 cache: max |stored * scale - x| / max |x| (e4m3 keeps 3 mantissa bits, e5m2 2)
KV_WRITE_TOLERANCE = {torch.float8_e4m3fn: 0.07, torch.float8_e5m2: 0.13}


def shape(name: str, small: bool = False) -> list[tuple[int, int]]:
    if name == "decode_b64":
        rng = random.Random(64)
        reqs = [(rng.randint(0, 8191), 1) for _ in range(64)]
        reqs[0], reqs[1] = (0, 1), (8191, 1)  # both ends of "context 1 to 8k"
    else:
        reqs = SHAPES[name]
    if small:  # CPU (Triton interpreter) runs: same structure, short contexts
        reqs = [(min(c, 70), min(q, 40)) for c, q in reqs][:6]
    return reqs


@dataclass(frozen=True)
class Case:
    shape: str
    num_heads: int = 32
    num_kv_heads: int = 8
    head_size: int = 128
    block_size: int = 16
    dtype: torch.dtype = torch.bfloat16
    kv_cache_dtype: str = "auto"
    prefill_decode: bool = False  # use_prefill_decode_attention
    layout: KVCacheLayout = KVCacheLayout.NHD
    sliding_window: int | None = None
    logits_soft_cap: float | None = None

    @property
    def name(self) -> str:
        dt = (
            str(self.dtype)
            .replace("torch.", "")
            .replace("bfloat16", "bf16")
            .replace("float16", "fp16")
            .replace("float32", "fp32")
        )
        parts = [
            self.shape,
            f"gqa{self.num_heads // self.num_kv_heads}",
            f"d{self.head_size}",
            f"bs{self.block_size}",
            dt,
        ]
        if self.kv_cache_dtype != "auto":
            parts.append("kv" + self.kv_cache_dtype)
        if self.prefill_decode:
            parts.append("pd")
        if self.layout != KVCacheLayout.NHD:
            parts.append(self.layout.value)
        if self.sliding_window is not None:
            parts.append(f"sw{self.sliding_window}")
        if self.logits_soft_cap is not None:
            parts.append(f"cap{self.logits_soft_cap:g}")
        return "-".join(parts)


def standard_cases(
    dtypes=(torch.bfloat16, torch.float16), fp8: bool = False, prefill_decode: bool = True, layouts=(KVCacheLayout.NHD,)
) -> list[Case]:
    """Every named shape in two head configurations (GQA 4:1, head 128, block 16; GQA 8:1, head 64,
    block 64) and each dtype; plus mixed with prefill/decode split, fp8 KV and other layouts."""
    configs = [
        dict(num_heads=32, num_kv_heads=8, head_size=128, block_size=16),
        dict(num_heads=32, num_kv_heads=4, head_size=64, block_size=64),
    ]
    cases = [Case(s, dtype=dt, **c) for dt in dtypes for c in configs for s in SHAPES]
    for c in configs:
        if prefill_decode:
            cases.append(Case("mixed", dtype=dtypes[0], prefill_decode=True, **c))
        if fp8:
            cases.append(Case("mixed", dtype=torch.bfloat16, kv_cache_dtype="fp8", **c))
            cases.append(Case("decode_b64", dtype=torch.bfloat16, kv_cache_dtype="fp8", **c))
        for layout in layouts:
            if layout != KVCacheLayout.NHD:
                cases.append(Case("mixed", dtype=dtypes[0], layout=layout, **c))
    return cases


def gemma_cases(block_size: int = 16, dtypes=(torch.bfloat16,)) -> list[Case]:
    """Gemma-2-9B's attention (16 query / 8 KV heads of 256) with a logits soft cap (5: small enough that the tanh
    bends most scores of the random data) and a window of 48 (shorter than most contexts), on every named shape;
    and the global layers' variant (soft cap, no window) on the mixed batch."""
    g = dict(num_heads=16, num_kv_heads=8, head_size=256, block_size=block_size, logits_soft_cap=5.0)
    cases = [Case(s, dtype=dt, sliding_window=48, **g) for dt in dtypes for s in SHAPES]
    return cases + [Case("mixed", dtype=dtypes[0], **g)]


def _allocate(backend_cls, num_blocks, case: Case, kv_dtype, device) -> torch.Tensor:
    from attnserve.model_executor.kv_cache import allocate_kv_caches

    return allocate_kv_caches(
        backend_cls, case.layout, 1, num_blocks, case.block_size, case.num_kv_heads, case.head_size, kv_dtype, device
    )[0]


def kv_dim_of(backend_cls) -> int:
    """Which dimension of the backend's cache shape indexes K/V (0 or 1)."""
    return 0 if backend_cls.get_kv_cache_shape(7, 16, 1, 8)[0] == 2 else 1


@dataclass
class Step:
    """One case's step, ready for ``impl.forward(query, key, value, kv_cache, metadata)``: the context is in
    the cache, this step's K/V are not yet."""

    impl: Any
    metadata: Any
    kv_cache: torch.Tensor  # the backend's shape, in the case's layout
    key_cache: torch.Tensor  # (num_blocks, block_size, Hkv, D) views of kv_cache
    value_cache: torch.Tensor
    query: torch.Tensor  # (T, Hq, D)
    key: torch.Tensor  # (T, Hkv, D)
    value: torch.Tensor
    positions: torch.Tensor  # (T,) int64, each token's position in its request
    slot_mapping: torch.Tensor  # (T,) int64
    query_start_loc: torch.Tensor  # (B + 1,) int32, CPU
    seq_lens: torch.Tensor  # (B,) int32, CPU
    block_table: torch.Tensor  # (B, W) int32, CPU
    k_scale: float
    v_scale: float
    kv_dtype: torch.dtype


def make_step(
    backend_cls,
    case: Case,
    device: str | torch.device,
    attention_config=None,
    small: bool = False,
    seed: int = 0,
    builder_attrs: dict | None = None,
    spare_blocks: int = 8,
) -> Step:
    """Build one case's cache (context written), inputs, metadata and impl for ``backend_cls``.

    ``builder_attrs`` are set on the builder after the runner's own; ``spare_blocks`` cache blocks belong
    to no request."""
    device = torch.device(device)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    reqs = shape(case.shape, small)
    bs, hq, hkv, d = case.block_size, case.num_heads, case.num_kv_heads, case.head_size
    seq_lens = [c + q for c, q in reqs]
    q_lens = [q for _, q in reqs]
    blocks_per = [-(-s // bs) for s in seq_lens]
    num_blocks = sum(blocks_per) + spare_blocks
    perm = torch.randperm(num_blocks, generator=gen)
    max_blocks = max(blocks_per)
    block_table = torch.zeros(len(reqs), max_blocks, dtype=torch.int32)
    at = 0
    for i, n in enumerate(blocks_per):
        block_table[i, :n] = perm[at : at + n]
        at += n
    fp8 = case.kv_cache_dtype != "auto"
    kv_dtype = kv_cache_torch_dtype(case.kv_cache_dtype, case.dtype)
    kv_cache = _allocate(backend_cls, num_blocks, case, kv_dtype, device)
    kv_cache.copy_(torch.randn(kv_cache.shape, generator=gen).to(kv_dtype))  # unused slots: finite junk
    key_cache, value_cache = kv_views(kv_cache, kv_dim_of(backend_cls))
    k_scale = v_scale = 1.0
    if fp8:  # per-tensor scales that use the fp8 range (data ~N(0,1) * 2 -> |x| up to ~10)
        fmax = torch.finfo(kv_dtype).max
        k_scale, v_scale = 10.0 / fmax, 12.0 / fmax

    def slots(i, positions):
        pos = torch.as_tensor(positions)
        return block_table[i, pos // bs].long() * bs + pos % bs

    # context already in the cache
    for i, (c, _) in enumerate(reqs):
        if c:
            k = torch.randn(c, hkv, d, generator=gen) * 2
            v = torch.randn(c, hkv, d, generator=gen) * 2
            write_kv_torch(
                k.to(device, case.dtype),
                v.to(device, case.dtype),
                key_cache,
                value_cache,
                slots(i, range(c)).to(device),
                k_scale,
                v_scale,
            )
    T = sum(q_lens)
    query = (torch.randn(T, hq, d, generator=gen) * 2).to(device, case.dtype)
    key = (torch.randn(T, hkv, d, generator=gen) * 2).to(device, case.dtype)
    value = (torch.randn(T, hkv, d, generator=gen) * 2).to(device, case.dtype)
    slot_mapping = torch.cat([slots(i, range(c, c + q)) for i, (c, q) in enumerate(reqs)]).to(device)
    qsl = torch.zeros(len(reqs) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(torch.tensor(q_lens), 0)
    seq_lens_t = torch.tensor(seq_lens, dtype=torch.int32)
    num_decodes = sum(1 for q in q_lens if q == 1)
    assert all(q == 1 for q in q_lens[:num_decodes])
    common = CommonAttentionMetadata(
        query_start_loc=qsl.to(device),
        query_start_loc_cpu=qsl,
        seq_lens=seq_lens_t.to(device),
        seq_lens_cpu=seq_lens_t,
        block_table=block_table.to(device),
        slot_mapping=slot_mapping,
        num_reqs=len(reqs),
        num_actual_tokens=T,
        max_query_len=max(q_lens),
        max_seq_len=max(seq_lens),
        num_decodes=num_decodes,
        num_decode_tokens=num_decodes,
        block_size=bs,
    )
    spec = AttentionLayerSpec(
        num_heads=hq,
        head_size=d,
        scale=d**-0.5,
        num_kv_heads=hkv,
        kv_cache_dtype=case.kv_cache_dtype,
        sliding_window=case.sliding_window,
        logits_soft_cap=case.logits_soft_cap,
    )
    from attnserve.config.attention import AttentionConfig

    cfg = attention_config or AttentionConfig()
    if case.prefill_decode:
        cfg = dataclasses.replace(cfg, use_prefill_decode_attention=True)
    builder = backend_cls.get_builder_cls()(spec, device, case.dtype, attention_config=cfg, kv_cache_layout=case.layout)
    if hasattr(builder, "num_cache_blocks"):
        builder.num_cache_blocks = num_blocks
    for attr, attr_value in (builder_attrs or {}).items():
        setattr(builder, attr, attr_value)
    impl = backend_cls.get_impl_cls()(spec, attention_config=cfg)
    if fp8:
        impl.set_kv_scales(k_scale, v_scale)
    positions = torch.cat([torch.arange(c, c + q) for c, q in reqs]).to(device)
    return Step(
        impl,
        builder.build(common),
        kv_cache,
        key_cache,
        value_cache,
        query,
        key,
        value,
        positions,
        slot_mapping,
        qsl,
        seq_lens_t,
        block_table,
        k_scale,
        v_scale,
        kv_dtype,
    )


def run_case(
    backend_cls,
    case: Case,
    device: str | torch.device,
    attention_config=None,
    small: bool = False,
    seed: int = 0,
    builder_attrs: dict | None = None,
    spare_blocks: int = 8,
    captured: dict | None = None,
    oracle: torch.dtype = torch.float32,
) -> dict:
    """Run one case through ``backend_cls``; returns max abs error, relative error, NaN flag, pass.

    ``builder_attrs``, ``spare_blocks``: see :func:`make_step`; ``captured`` (a dict) receives the step's
    ``metadata``, ``block_table`` and ``seq_lens``; ``oracle``: the reference's arithmetic (float64: the fp8
    tests' oracle, which reads the same fp8 cache and, where the kernel quantized the query, the same query)."""
    st = make_step(backend_cls, case, device, attention_config, small, seed, builder_attrs, spare_blocks)
    impl, metadata, kv_cache, key_cache, value_cache = st.impl, st.metadata, st.kv_cache, st.key_cache, st.value_cache
    query, key, slot_mapping, k_scale, v_scale = st.query, st.key, st.slot_mapping, st.k_scale, st.v_scale
    qsl, seq_lens_t, block_table, kv_dtype = st.query_start_loc, st.seq_lens, st.block_table, st.kv_dtype
    fp8, bs = case.kv_cache_dtype != "auto", case.block_size
    if captured is not None:
        captured.update(metadata=metadata, block_table=block_table, seq_lens=seq_lens_t.tolist())
    out = impl.forward(query, key, st.value, kv_cache, metadata)
    if kv_cache.is_cuda:
        torch.cuda.synchronize()
    # reference over the cache as the backend left it (dequantized when fp8)
    ref_k = key_cache.to(oracle) * k_scale
    ref_v = value_cache.to(oracle) * v_scale
    ref_cache = torch.stack([ref_k, ref_v])
    ref_q = query.to(oracle)
    fmax = torch.finfo(kv_dtype).max if fp8 else None
    for first, end, q_scale in getattr(impl, "last_q_scales", []):
        # the kernel saw an fp8 query: so does the reference (quantization error is the format's, not a bug)
        q_scale = torch.as_tensor(q_scale, dtype=torch.float32, device=ref_q.device)
        ref_q[first:end] = (query[first:end].float() / q_scale).clamp(-fmax, fmax).to(kv_dtype).to(oracle) * q_scale.to(
            oracle
        )
    ref = reference_paged_attention(
        ref_q,
        ref_cache,
        qsl,
        seq_lens_t,
        block_table,
        impl.scale,
        sliding_window=case.sliding_window,
        logits_soft_cap=case.logits_soft_cap,
    )
    # and the step's K/V must have landed in the cache
    written = key_cache[slot_mapping // bs, slot_mapping % bs].float() * k_scale
    kv_err = (written - key.float()).abs().max().item() / key.float().abs().max().item()
    err = (out.to(ref.dtype) - ref).abs().max().item()
    rel = err / max(ref.abs().max().item(), 1e-6)
    tol = TOLERANCE["fp8" if fp8 else case.dtype]
    nan = bool(torch.isnan(out).any())
    return {
        "case": case.name,
        "max_err": err,
        "rel_err": rel,
        "kv_write_err": kv_err,
        "nan": nan,
        "tol": tol,
        "pass": (not nan) and rel <= tol and kv_err <= max(tol, KV_WRITE_TOLERANCE.get(kv_dtype, 0.0)),
    }


def run_rope_paths(
    backend_cls,
    case: Case,
    device: str | torch.device,
    attention_config=None,
    qk_norm: bool = False,
    small: bool = False,
    seed: int = 0,
) -> dict[str, tuple[torch.Tensor, ...]]:
    """One step of a RoPE model's attention layer both ways, on copies of the same inputs and cache:
    ``unfused`` = RoPE on q and k, then ``Attention.forward`` (the backend writes K/V); ``fused`` =
    ``Attention.forward_with_rope`` (where the backend has a ``kv_write_target``, the RoPE op writes K/V and
    the backend skips its write). q, k and v are views of one fused qkv tensor, as the models pass them;
    ``qk_norm``: Qwen3's per-head RMSNorm first. Returns, per path, (output, qkv after the step, kv cache)."""
    from types import SimpleNamespace

    from attnserve.attention.layer import Attention
    from attnserve.layers.norm import RMSNorm
    from attnserve.layers.rotary import RotaryEmbedding

    st = make_step(backend_cls, case, device, attention_config, small, seed)
    device, d = st.query.device, case.head_size
    gen = torch.Generator().manual_seed(seed + 1)
    rotary = RotaryEmbedding(d, int(st.seq_lens.max()) + 1, 1e6).to(device)
    norms = (None, None)
    if qk_norm:
        norms = tuple(RMSNorm(d, 1e-6).to(device, case.dtype) for _ in range(2))
        for n in norms:
            n.weight.data.copy_(torch.randn(d, generator=gen) * 0.1 + 1)
    qkv = torch.cat([x.flatten(1) for x in (st.query, st.key, st.value)], dim=-1)
    attn = Attention(st.impl, 0)
    results = {}
    for path in ("unfused", "fused"):
        step_qkv, cache = qkv.clone(), st.kv_cache.clone()  # clone keeps the cache's (NHD/HND) strides
        t = step_qkv.shape[0]
        q, k, v = step_qkv.split([st.query[0].numel(), st.key[0].numel(), st.value[0].numel()], dim=-1)
        q, k, v = q.view(t, -1, d), k.view(t, -1, d), v.view(t, -1, d)
        batch = SimpleNamespace(kv_caches=[cache], attn_metadata=st.metadata)
        with torch.no_grad():
            if path == "unfused":
                rotary(st.positions, q, k, *norms)
                out = attn(q, k, v, batch)
            else:
                out = attn.forward_with_rope(q, k, v, batch, rotary.inputs(st.positions, *norms))
        results[path] = (out, step_qkv, cache)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return results
