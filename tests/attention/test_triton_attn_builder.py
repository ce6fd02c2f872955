"""TRITON_ATTN's metadata builder: how many KV splits a decode call gets, and its launch options (host side)."""

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
):
    spec = AttentionLayerSpec(num_heads=4 * hkv, head_size=128, scale=128**-0.5, num_kv_heads=hkv)
    builder = TritonAttentionBackend.get_builder_cls()(spec, torch.device("cpu"), dtype)
    builder.num_sms = num_sms  # an H200's
    common, _ = make_step(
        [query_len] * batch, [context] * batch, block, torch.Generator().manual_seed(0), torch.device("cpu")
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


def test_prefill_calls_keep_the_default_launch():
    (call,) = _calls(2, 300, query_len=100)
    assert (call.num_splits, call.launch) == (1, {})
