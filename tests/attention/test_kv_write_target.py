"""``AttentionImpl.kv_write_target`` / ``forward(..., kv_written=True)``: the views a backend exposes are the
storage it reads, so a step whose K/V were written by the layer's RoPE op (``Attention.forward_with_rope``)
gives the same output and cache as the backend's own write, bit for bit.

On CPU: CPU_ATTN and FLEX_ATTENTION (eager flex_attention) with the PyTorch ops, and TRITON_ATTN under the
Triton interpreter with the CUDA dispatch forced (its RoPE, KV-write, fused and attention kernels all run as
Triton kernels). FLASH_ATTN and FLASHINFER run only on a GPU: ``tests/gpu/test_rope_kv_write_gpu.py``.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from attnserve.attention.backend import KVCacheLayout
from attnserve.kernels.kv_write import kv_views
from attnserve.attention.registry import AttentionBackendEnum
from tests.attention.rope_paths_interpreted import PATH_CASES, bits
from tests.gpu.cases import Case, kv_dim_of, make_step, run_rope_paths
from tests.helpers import run_cases_in_triton_interpreter

CPU_BACKENDS = ["CPU_ATTN", "FLEX_ATTENTION"]
SHAPES = ["decode_b64", "prefill", "mixed"]


def _case(shape: str, dtype=torch.float32, **kw) -> Case:
    return Case(shape, num_heads=8, num_kv_heads=2, head_size=32, dtype=dtype, **kw)


def assert_paths_equal(results: dict) -> None:
    for what, a, b in zip(("output", "qkv", "kv cache"), results["unfused"], results["fused"], strict=True):
        assert a.stride() == b.stride(), what
        assert torch.equal(bits(a), bits(b)), what


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("qk_norm", [False, True], ids=["rope", "qk_norm-rope"])
def test_forward_with_rope_equals_rope_then_forward_on_cpu(backend, shape, dtype, qk_norm):
    backend_cls = AttentionBackendEnum[backend].get_class()
    assert_paths_equal(run_rope_paths(backend_cls, _case(shape, dtype), "cpu", qk_norm=qk_norm, small=True))


def test_forward_with_rope_flex_hnd_layout():
    backend_cls = AttentionBackendEnum.FLEX_ATTENTION.get_class()
    assert_paths_equal(
        run_rope_paths(backend_cls, _case("mixed", layout=KVCacheLayout.HND), "cpu", qk_norm=True, small=True)
    )


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_kv_written_skips_the_backends_write(backend):
    """With ``kv_written=True`` the backend writes nothing (this step's slots keep what was there)."""
    st = make_step(AttentionBackendEnum[backend].get_class(), _case("mixed"), "cpu", small=True)
    before = st.kv_cache.clone()
    st.impl.forward(st.query, st.key, st.value, st.kv_cache, st.metadata, kv_written=True)
    assert torch.equal(st.kv_cache, before)
    st.impl.forward(st.query, st.key, st.value, st.kv_cache, st.metadata)
    assert not torch.equal(st.kv_cache, before)


@pytest.mark.parametrize("backend", ["CPU_ATTN", "FLEX_ATTENTION", "TRITON_ATTN", "FLASHINFER"])
@pytest.mark.parametrize("layout", [KVCacheLayout.NHD, KVCacheLayout.HND])
def test_kv_write_target_views_the_backends_cache(backend, layout):
    """The target's views are ``kv_cache``'s K and V halves (the backend's own cache shape, either memory
    order), with the impl's fp8 scales and the metadata's slot mapping. (FLASH_ATTN's impl needs its
    package to be built: checked on the GPU.)"""
    from attnserve.attention.backend import AttentionLayerSpec
    from attnserve.model_executor.kv_cache import allocate_kv_caches

    if backend == "TRITON_ATTN":
        pytest.importorskip("triton")  # its impl imports its kernels (torch's CPU wheel brings no Triton)
    backend_cls = AttentionBackendEnum[backend].get_class()
    impl = backend_cls.get_impl_cls()(AttentionLayerSpec(num_heads=4, head_size=32, scale=1.0, num_kv_heads=2))
    fp8 = "fp8" in backend_cls.supported_kv_cache_dtypes  # a 16-bit-only backend's target needs no scales
    impl.set_kv_scales(0.5, 0.25)
    (cache,) = allocate_kv_caches(backend_cls, layout, 1, 3, 16, 2, 32, torch.float32, torch.device("cpu"))
    slots = torch.tensor([5, -1, 40])
    target = impl.kv_write_target(cache, SimpleNamespace(slot_mapping=slots))
    want_k, want_v = kv_views(cache, kv_dim_of(backend_cls))
    for got, want in ((target.key_cache, want_k), (target.value_cache, want_v)):
        assert got.shape == (3, 16, 2, 32)
        assert got.data_ptr() == want.data_ptr() and got.stride() == want.stride()
    assert target.slot_mapping is slots
    assert (target.k_scale, target.v_scale) == ((0.5, 0.25) if fp8 else (1.0, 1.0))


# ------------------------------------------------------------------ TRITON_ATTN under the Triton interpreter
@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    pytest.importorskip("triton")
    return run_cases_in_triton_interpreter(
        "tests.attention.rope_paths_interpreted", PATH_CASES, tmp_path_factory.mktemp("rope_paths")
    )


@pytest.mark.parametrize("name", list(PATH_CASES))
def test_triton_attn_fused_kernel_path_equals_unfused_in_interpreter(name, interpreted):
    """Fused kernel + attention with ``kv_written=True`` vs the RoPE kernel + ``reshape_and_cache`` +
    attention: same output, q/k and cache, bit for bit."""
    results = interpreted[name]
    assert results["triton_ops_ran"]  # the Triton kernels ran, not the PyTorch fallbacks
    assert_paths_equal(results)
