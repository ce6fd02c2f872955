"""TRITON_ATTN's metadata builder: its calls per step, how many KV splits a decode call gets, the tiles' rows and
launch options (host side)."""

from __future__ import annotations

import pytest
import torch

from attnserve.attention.backend import AttentionLayerSpec
from attnserve.benchmarks.attention import make_step

pytest.importorskip("triton")  # the builder imports the kernels' module (torch's CPU wheel brings no Triton)

from attnserve.attention.backends.triton_attn import TritonAttentionBackend  # noqa: E402


def _calls(
    batch: int,
    context: int,
    block: int = 16,
    hkv: int = 8,
    query_len: int = 1,
    num_sms: int = 132,
    dtype: torch.dtype = torch.bfloat16,
    head: int = 128,
    kv_cache_dtype: str = "auto",
    decodes: int = 0,
):
    """The calls of a step of ``decodes`` decode requests, then ``batch`` requests of ``query_len`` tokens, each
    with ``context`` tokens in all."""
    spec = AttentionLayerSpec(
        num_heads=4 * hkv, head_size=head, scale=head**-0.5, num_kv_heads=hkv, kv_cache_dtype=kv_cache_dtype
    )
    builder = TritonAttentionBackend.get_builder_cls()(spec, torch.device("cpu"), dtype)
    builder.num_sms = num_sms  # an H200's
    common, _ = make_step(
        [1] * decodes + [query_len] * batch,
        [context] * (decodes + batch),
        block,
        torch.Generator().manual_seed(0),
        torch.device("cpu"),
    )
    return builder.build(common).calls


@pytest.mark.parametrize(
    "batch,context,block,splits",
    [
        (1, 1024, 16, 16),  # 8 programs: 2 x 132 / 8 = 33 wanted, one per 64-token KV tile of 1024 tokens
        (1, 4096, 16, 32),  # 64 tiles: the cap
        (1, 4096, 64, 32),  # 64-token pages are one tile each
        (1, 100, 16, 2),  # two tiles (64 + 36 tokens)
        (1, 64, 16, 1),  # one tile: nothing to split
        (4, 1024, 16, 9),  # 32 programs: 264 / 32 -> 9 (the kernel rounds it up to 16)
        (33, 1024, 16, 1),  # 264 programs fill two per SM
        (64, 1024, 16, 1),
    ],
)
def test_decode_splits(batch, context, block, splits):
    (call,) = _calls(batch, context, block)
    assert call.num_splits == splits
    want = {"num_stages": 2, "num_warps": 8} if splits > 1 else {"num_stages": 2}
    assert call.launch == want


def test_float32_tiles_are_32_tokens():
    """float32 head 128 walks 32-token tiles, so a 100-token context is 4 of them."""
    (call,) = _calls(1, 100, dtype=torch.float32)
    assert call.num_splits == 4


def test_prefill_calls_take_64_row_tiles():
    """GQA 4: 64 rows are 16 tokens, so two 100-token prompts are 7 + 7 tiles; KV tiles of 64 tokens."""
    (call,) = _calls(2, 300, query_len=100)
    assert (call.num_splits, call.launch, call.block_m, call.pages_per_tile, call.decode) == (
        1,
        {"num_warps": 4, "num_stages": 2},
        64,
        4,
        False,
    )
    assert call.tile_seq.tolist() == [0] * 7 + [1] * 7
    assert call.tile_start.tolist() == list(range(0, 112, 16)) * 2


@pytest.mark.parametrize(
    "kw,pages",
    [(dict(kv_cache_dtype="fp8"), 4), (dict(head=256), 4), (dict(head=64, block=32), 2), (dict(block=64), 1)],
    ids=["fp8-cache", "head-256", "head-64-block-32", "block-64"],
)
def test_prefill_tiles_of_64_tokens_over_any_cache_and_head(kw, pages):
    (call,) = _calls(2, 300, query_len=100, **kw)
    assert (call.block_m, call.pages_per_tile) == (64, pages)


@pytest.mark.parametrize("kw", [dict(dtype=torch.float32), dict(block=128)], ids=["float32", "block-128"])
def test_prefill_keeps_16_rows_where_64_were_not_measured(kw):
    """float32 (twice the registers) and pages over 64 tokens (a KV tile is at least a page)."""
    (call,) = _calls(2, 300, query_len=100, **kw)
    assert (call.block_m, call.pages_per_tile, call.launch, call.tile_seq.numel()) == (16, None, {}, 2 * 25)


def test_mixed_step_runs_decodes_then_prefills():
    """3 decodes at 1024 tokens (24 programs: 11 splits for 264 wanted) and one 100-token prefill chunk."""
    decode, prefill = _calls(1, 1024, query_len=100, decodes=3)
    assert (decode.decode, decode.num_splits, decode.block_m, decode.token_range) == (True, 11, 16, (0, 3))
    assert decode.launch == {"num_stages": 2, "num_warps": 8}
    assert (prefill.decode, prefill.num_splits, prefill.block_m, prefill.token_range) == (False, 1, 64, (3, 103))
    assert prefill.tile_seq.tolist() == [3] * 7


def test_cascade_step_is_a_prefix_call_and_a_suffix_call():
    """64 decodes sharing a 2048-token prefix: the prefix call's 4 tiles of 16 tokens x 8 KV heads = 32 programs
    want 9 splits (264 / 32): 8, the power of two below; the suffix's 512 programs fill the GPU: 1 split (9 slots
    a token to merge)."""
    import dataclasses

    from attnserve.attention.cascade import CascadePrefix

    spec = AttentionLayerSpec(num_heads=32, head_size=128, scale=128**-0.5, num_kv_heads=8)
    builder = TritonAttentionBackend.get_builder_cls()(spec, torch.device("cpu"), torch.bfloat16)
    builder.num_sms = 132
    assert builder.supports_cascade
    common, _ = make_step([1] * 64, [100] * 64, 16, torch.Generator().manual_seed(0), torch.device("cpu"))
    prefix = CascadePrefix(torch.zeros(1, 128, dtype=torch.int32), torch.tensor([2048]), torch.tensor([0, 64]), 2048)
    first, second = builder.build(dataclasses.replace(common, cascade=prefix)).calls
    assert (first.cascade, first.decode, first.block_m, first.num_splits, first.token_range) == (
        prefix,
        False,
        64,
        8,
        (0, 64),
    )
    assert first.tile_seq.tolist() == [0] * 4 and first.tile_start.tolist() == [0, 16, 32, 48]
    assert (second.cascade, second.decode, second.block_m, second.num_splits) == (None, True, 16, 1)


@pytest.mark.parametrize("kw", [dict(kv_cache_dtype="fp8"), dict(sliding_window=128)], ids=["fp8", "window"])
def test_no_cascade_over_fp8_or_with_a_window(kw):
    spec = AttentionLayerSpec(num_heads=32, head_size=128, scale=128**-0.5, num_kv_heads=8, **kw)
    assert not TritonAttentionBackend.get_builder_cls()(spec, torch.device("cpu"), torch.bfloat16).supports_cascade


def test_ordered_decode_calls_take_the_longest_context_first(monkeypatch):
    """``ORDER_DECODES`` on: a decode call's tiles are its requests longest context first (ties in request order)
    and marked ``ordered``; a step's prefill call is not; off (the default), request order."""
    import attnserve.attention.backends.triton_attn_plan as plan

    spec = AttentionLayerSpec(num_heads=32, head_size=128, scale=128**-0.5, num_kv_heads=8)
    builder = TritonAttentionBackend.get_builder_cls()(spec, torch.device("cpu"), torch.bfloat16)
    builder.num_sms = 132
    gen, cpu = torch.Generator().manual_seed(0), torch.device("cpu")
    decode, _ = make_step([1, 1, 1, 1], [5, 70, 33, 70], 16, gen, cpu)
    mixed, _ = make_step([1, 1, 40], [5, 70, 90], 16, gen, cpu)
    monkeypatch.setattr(plan, "ORDER_DECODES", True)
    (call,) = builder.build(decode).calls
    assert call.ordered and call.decode and call.tile_seq.tolist() == [1, 3, 2, 0]
    decodes, prefills = builder.build(mixed).calls
    assert decodes.ordered and decodes.tile_seq.tolist() == [1, 0]
    assert not prefills.ordered and prefills.tile_seq.tolist() == [2, 2, 2]  # its 40 tokens in 16-token tiles
    monkeypatch.setattr(plan, "ORDER_DECODES", False)
    (call,) = builder.build(decode).calls
    assert not call.ordered and call.tile_seq.tolist() == [0, 1, 2, 3]
