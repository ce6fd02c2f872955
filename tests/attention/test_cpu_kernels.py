"""CPU-runnable parts of the GPU backends: the PyTorch KV-write fallback in every cache shape and layout,
and FLEX_ATTENTION (eager flex_attention on CPU) against the reference on the named shapes."""

from __future__ import annotations

import pytest
import torch

from attnserve.attention.backend import KVCacheLayout
from attnserve.kernels.kv_write import kv_views, write_kv, write_kv_cache, write_kv_torch
from attnserve.model_executor.kv_cache import allocate_kv_caches
from tests.gpu.cases import SHAPES, Case, gemma_cases, run_case


class _Shape2N:
    get_kv_cache_shape = staticmethod(lambda n, b, h, d: (2, n, b, h, d))

    @staticmethod
    def get_kv_cache_stride_order(layout):
        return (0, 1, 3, 2, 4) if layout == KVCacheLayout.HND else (0, 1, 2, 3, 4)


class _ShapeN2(_Shape2N):
    get_kv_cache_shape = staticmethod(lambda n, b, h, d: (n, 2, b, h, d))


@pytest.mark.parametrize("backend,kv_dim", [(_Shape2N, 0), (_ShapeN2, 1)])
@pytest.mark.parametrize("layout", [KVCacheLayout.NHD, KVCacheLayout.HND])
def test_kv_write_fallback_every_shape_and_layout(backend, kv_dim, layout):
    cache = allocate_kv_caches(backend, layout, 1, 5, 16, 3, 8, torch.float32, torch.device("cpu"))[0]
    key, value = torch.randn(4, 3, 8), torch.randn(4, 3, 8)
    slots = torch.tensor([0, 17, -1, 79])
    kc, vc = kv_views(cache, kv_dim)
    write_kv(key, value, kc, vc, slots)  # CPU tensors: the PyTorch path
    for t, s in enumerate(slots.tolist()):
        if s < 0:
            continue
        assert torch.equal(kc[s // 16, s % 16], key[t]) and torch.equal(vc[s // 16, s % 16], value[t])
    assert int((kc != 0).any(-1).any(-1).sum()) == 3  # the padding token wrote nothing


def test_kv_write_fp8_scales_round_trip():
    cache = torch.zeros(2, 4, 16, 2, 8, dtype=torch.float8_e4m3fn)
    key = torch.randn(3, 2, 8) * 4
    kc, vc = kv_views(cache, 0)
    write_kv_torch(key, key, kc, vc, torch.tensor([1, 2, 3]), k_scale=0.05, v_scale=0.05)
    back = kc[0, 1:4].float() * 0.05
    assert (back - key).abs().max() <= 0.07 * key.abs().max()


def test_write_kv_cache_keeps_its_contract():
    cache = torch.zeros(2, 2, 16, 1, 4)
    write_kv_cache(torch.ones(1, 1, 4), 2 * torch.ones(1, 1, 4), cache, torch.tensor([20]))
    assert cache[0, 1, 4].sum() == 4 and cache[1, 1, 4].sum() == 8


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("prefill_decode", [False, True])
@pytest.mark.parametrize("gather_kv", [True, False], ids=["gathered-keys", "whole-cache-keys"])
@pytest.mark.parametrize("window", [None, 20])
def test_flex_attention_on_cpu_matches_reference(shape, prefill_decode, gather_kv, window):
    """Both key sequences (the CPU default: the step's gathered blocks; CUDA's: the whole cache) give the
    reference's answer, sliding window included; the cache holds 40 blocks no request owns."""
    from attnserve.attention.backends.flex_attention import FlexAttentionBackend

    case = Case(
        shape,
        num_heads=8,
        num_kv_heads=2,
        head_size=32,
        dtype=torch.float32,
        prefill_decode=prefill_decode,
        sliding_window=window,
    )
    row = run_case(
        FlexAttentionBackend, case, "cpu", small=True, builder_attrs={"gather_kv": gather_kv}, spare_blocks=40
    )
    assert row["pass"], row


@pytest.mark.parametrize("prefill_decode", [False, True])
def test_flex_attention_on_cpu_keys_are_only_the_steps_blocks(prefill_decode):
    """On CPU (eager flex_attention scores every key) each call's key sequence is exactly the blocks its
    requests own, in block-id order, however large the cache: cost follows the blocks in use."""
    from attnserve.attention.backends.flex_attention import FlexAttentionBackend

    case = Case("mixed", num_heads=8, num_kv_heads=2, head_size=32, dtype=torch.float32, prefill_decode=prefill_decode)
    got: dict = {}
    row = run_case(FlexAttentionBackend, case, "cpu", small=True, spare_blocks=5000, captured=got)
    assert row["pass"], row
    table, seq_lens, calls = got["block_table"], got["seq_lens"], got["metadata"].calls
    ranges = [(0, 4), (4, 6)] if prefill_decode else [(0, 6)]  # small "mixed": 4 decodes, 2 prefills
    assert len(calls) == len(ranges)
    for call, (lo, hi) in zip(calls, ranges):
        owned = sorted(int(table[i, j]) for i in range(lo, hi) for j in range(-(-seq_lens[i] // 16)))
        assert call.kv_blocks.tolist() == owned
        assert call.block_mask.seq_lengths == (call.padded_len, len(owned) * 16)


@pytest.mark.parametrize("gather_kv", [True, False])
def test_flex_attention_on_cpu_hnd_layout(gather_kv):
    from attnserve.attention.backends.flex_attention import FlexAttentionBackend

    case = Case("mixed", num_heads=8, num_kv_heads=2, head_size=32, dtype=torch.float32, layout=KVCacheLayout.HND)
    row = run_case(FlexAttentionBackend, case, "cpu", small=True, builder_attrs={"gather_kv": gather_kv})
    assert row["pass"], row


def test_flex_attention_whole_cache_keys_on_request():
    """``gather_kv=False`` (CUDA's default, where the compiled kernel skips unlisted blocks) keeps the whole
    cache as the key sequence."""
    from attnserve.attention.backends.flex_attention import FlexAttentionBackend

    case = Case("mixed", num_heads=8, num_kv_heads=2, head_size=32, dtype=torch.float32)
    got: dict = {}
    row = run_case(
        FlexAttentionBackend, case, "cpu", small=True, spare_blocks=40, builder_attrs={"gather_kv": False}, captured=got
    )
    assert row["pass"], row
    (call,) = got["metadata"].calls
    n_blocks = sum(-(-s // 16) for s in got["seq_lens"]) + 40
    assert call.kv_blocks is None and call.block_mask.seq_lengths == (call.padded_len, n_blocks * 16)


@pytest.mark.parametrize("backend", ["CPU_ATTN", "FLEX_ATTENTION"])
@pytest.mark.parametrize("case", gemma_cases(dtypes=(torch.float32,)), ids=lambda c: c.name)
def test_soft_cap_and_window_on_cpu_match_reference(backend, case):
    """Gemma 2's attention (head 256, soft cap, window) on the CPU backends that claim the soft cap."""
    from attnserve.attention.registry import AttentionBackendEnum

    row = run_case(AttentionBackendEnum[backend].get_class(), case, "cpu", small=True)
    assert row["pass"], row
