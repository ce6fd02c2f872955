"""The keys-major fp8 decode kernel (``kernels/triton_fp8_decode.py``) in the Triton interpreter, against the
float32 reference over the same dequantized cache and against the unified kernel's fp8 path: GQA widths,
head sizes, pages smaller and larger than the KV tile, ragged lengths, splits, both fp8 formats and both V
conversions. TRITON_ATTN's choice of kernel per call (``TritonAttentionImpl._keys_major``) is checked too.
The GPU run of the same kernel through the backend is ``tests/gpu/test_fp8_kv_vs_reference.py``."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import run_cases_in_triton_interpreter

FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
# name -> (query heads, kv heads, head size, page, seq lens, format, splits, KV tile, PV conversion)
CASES = {
    "llama-gqa4-page16": (8, 2, 128, 16, [100, 37, 16], "e4m3", 1, 64, "f16v"),
    "qwen-gqa2-e5m2": (4, 2, 128, 16, [65, 1], "e5m2", 1, 64, "f16v"),
    "smollm-gqa3-head64": (9, 3, 64, 16, [70, 130], "e4m3", 1, 64, "f16"),
    "gqa8-page64-tile32": (16, 2, 64, 64, [150, 64], "e4m3", 1, 32, "f16v"),
    "splits4": (8, 2, 128, 16, [300, 5, 129], "e4m3", 4, 64, "f16v"),
    "splits3-rounded-to-4": (8, 2, 128, 16, [300, 70], "e4m3", 3, 64, "f16v"),  # the builder's counts are any
    "gqa16-head256": (16, 1, 256, 32, [90], "e5m2", 2, 64, "f16"),
}


def fp8_decode_case(hq, hkv, head, page, seq_lens, fmt, splits, block_n, pv, seed=0) -> dict:
    """A decode step over an fp8 cache: N(0, 2^2) K/V stored as ``x / scale`` (saturated), N(0, 1) bf16 queries,
    pages a random permutation of the cache."""
    g = torch.Generator().manual_seed(seed)
    per = max(-(-n // page) for n in seq_lens)
    batch = len(seq_lens)
    num_blocks = batch * per + 1
    table = torch.randperm(num_blocks - 1, generator=g)[: batch * per].to(torch.int32).view(batch, per)
    dtype, fmax = FP8[fmt], torch.finfo(FP8[fmt]).max
    ks, vs = 10.0 / fmax, 12.0 / fmax
    kv = torch.randn(2, num_blocks, page, hkv, head, generator=g) * 2
    return dict(
        query=torch.randn(batch, hq, head, generator=g).to(torch.bfloat16),
        key_cache=(kv[0] / ks).clamp(-fmax, fmax).to(dtype),
        value_cache=(kv[1] / vs).clamp(-fmax, fmax).to(dtype),
        block_table=table,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        scale=head**-0.5,
        k_scale=ks,
        v_scale=vs,
        num_splits=splits,
        block_n=block_n,
        pv=pv,
    )


def cases() -> dict:
    return {name: fp8_decode_case(*c) for name, c in CASES.items()}


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    pytest.importorskip("triton")
    return run_cases_in_triton_interpreter(
        "tests.kernels.fp8_decode_interpreted", cases(), tmp_path_factory.mktemp("fp8d")
    )


def reference(case: dict) -> torch.Tensor:
    from attnserve.kernels.reference import reference_paged_attention

    q = case["query"]
    kv = torch.stack([case["key_cache"].float() * case["k_scale"], case["value_cache"].float() * case["v_scale"]])
    qsl = torch.arange(q.shape[0] + 1, dtype=torch.int32)
    return reference_paged_attention(q.float(), kv, qsl, case["seq_lens"], case["block_table"], case["scale"])


@pytest.mark.parametrize("name", list(CASES))
def test_keys_major_fp8_decode_matches_reference_and_unified_kernel(name, interpreted):
    case = cases()[name]
    ref = reference(case)
    got = interpreted[name]
    top = float(ref.abs().max())
    # float16 dots over values float16 holds exactly, a bf16 output: the output's rounding dominates
    assert float((got["keys"].float() - ref).abs().max()) / top <= 1e-2
    assert float((got["keys"].float() - got["unified"].float()).abs().max()) / top <= 1e-2
    assert got["keys"].dtype == torch.bfloat16 and got["keys"].shape == case["query"].shape


def test_triton_attn_takes_the_keys_major_kernel_only_where_it_applies():
    pytest.importorskip("triton")
    from attnserve.attention.backend import AttentionLayerSpec
    from attnserve.attention.backends.triton_attn import TritonAttentionImpl, TritonAttentionTiles

    def impl(**spec):
        fields = dict(num_heads=8, head_size=128, scale=128**-0.5, num_kv_heads=2, kv_cache_dtype="fp8")
        return TritonAttentionImpl(AttentionLayerSpec(**{**fields, **spec}))

    one = torch.zeros(1, dtype=torch.int32)
    decode = TritonAttentionTiles(one, one, 1, (0, 1), {}, decode=True)
    mixed = TritonAttentionTiles(one, one, 1, (0, 1), {}, decode=False)
    bf16, f32 = torch.empty(1, 8, 128, dtype=torch.bfloat16), torch.empty(1, 8, 128)
    assert impl()._keys_major(decode, bf16) is True
    assert impl()._keys_major(mixed, bf16) is False
    assert impl()._keys_major(decode, f32) is False  # float32 queries: the unified kernel's "cast" path
    assert impl(kv_cache_dtype="auto")._keys_major(decode, bf16) is False
    assert impl(sliding_window=64)._keys_major(decode, bf16) is False
    assert impl(logits_soft_cap=30.0)._keys_major(decode, bf16) is False
    assert impl(head_size=96, scale=96**-0.5)._keys_major(decode, bf16) is False
    with_sinks = impl()
    with_sinks.sinks = torch.zeros(8)
    assert with_sinks._keys_major(decode, bf16) is False
