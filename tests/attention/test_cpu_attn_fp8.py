"""CPU_ATTN with an fp8 KV cache against a float64 oracle that reads the same fp8 cache, and the saturating write."""

from __future__ import annotations

import pytest
import torch

from attnserve.attention.backend import AttentionLayerSpec
from attnserve.attention.registry import AttentionBackendEnum
from attnserve.kernels.kv_write import write_kv_torch
from tests.gpu.cases import Case, run_case


@pytest.mark.parametrize("kv", ["fp8", "fp8_e5m2"])
@pytest.mark.parametrize("shape", ["decode_b64", "prefill", "mixed"])
@pytest.mark.parametrize("block_size", [16, 32, 64])
def test_cpu_attn_fp8_matches_float64_oracle(kv, shape, block_size):
    """Decode, prefill and mixed batches, GQA 4:1, block sizes 16/32/64: the same fp8 values are read, so only
    float32 arithmetic separates CPU_ATTN from the float64 oracle; the step's K/V land in the cache within the
    format's rounding."""
    case = Case(
        shape, num_heads=8, num_kv_heads=2, head_size=32, block_size=block_size, dtype=torch.float32, kv_cache_dtype=kv
    )
    row = run_case(AttentionBackendEnum.CPU_ATTN.get_class(), case, "cpu", small=True, oracle=torch.float64)
    assert not row["nan"]
    assert row["rel_err"] < 2e-5, row
    assert row["kv_write_err"] < (0.07 if kv == "fp8" else 0.13), row  # e4m3: 3 mantissa bits, e5m2: 2


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_write_saturates(dtype):
    """Values beyond the format's range (and infinities) are stored as +-max, never inf or nan."""
    cache = torch.zeros(2, 1, 4, 1, 2, dtype=dtype)
    fmax = torch.finfo(dtype).max
    key = torch.tensor([[[1e9, -1e9]], [[float("inf"), 3.0]]])
    value = torch.tensor([[[-1e9, 0.5]], [[2.0, float("-inf")]]])
    write_kv_torch(key, value, cache[0], cache[1], torch.tensor([0, 1]), k_scale=0.5, v_scale=2.0)
    stored = cache.float()
    assert torch.isfinite(stored).all()
    assert stored[0, 0, 0, 0].tolist() == [fmax, -fmax]
    assert stored[0, 0, 1, 0].tolist() == [fmax, 6.0]  # 3.0 / 0.5
    assert stored[1, 0, 0, 0].tolist() == [-fmax, 0.25]  # 0.5 / 2.0
    assert stored[1, 0, 1, 0].tolist() == [1.0, -fmax]


def test_cpu_attn_fp8_reads_through_the_scales():
    """A cache written with scale s and read back: attention over values v equals the oracle's over v (not v/s)."""
    spec = AttentionLayerSpec(num_heads=2, head_size=8, scale=8**-0.5, num_kv_heads=1, kv_cache_dtype="fp8")
    backend = AttentionBackendEnum.CPU_ATTN.get_class()
    impl = backend.get_impl_cls()(spec)
    impl.set_kv_scales(4.0, 8.0)
    cache = torch.zeros(2, 1, 16, 1, 8, dtype=torch.float8_e4m3fn)
    from attnserve.attention.backend import CommonAttentionMetadata

    qsl, seq = torch.tensor([0, 1], dtype=torch.int32), torch.tensor([1], dtype=torch.int32)
    common = CommonAttentionMetadata(
        qsl, qsl, seq, seq, torch.zeros(1, 1, dtype=torch.int32), torch.tensor([0]), 1, 1, 1, 1, 1, 1, 16
    )
    metadata = backend.get_builder_cls()(spec, torch.device("cpu"), torch.float32).build(common)
    v = torch.full((1, 1, 8), 96.0)  # 96 / 8 = 12 stored exactly in e4m3
    out = impl.forward(torch.ones(1, 2, 8), torch.ones(1, 1, 8), v, cache, metadata)
    assert cache[1, 0, 0, 0, 0].float().item() == 12.0
    assert torch.equal(out, torch.full((1, 2, 8), 96.0))  # one key: softmax weight 1, the value read back
