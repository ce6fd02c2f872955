"""Cascade attention's host rules and merge: the shared run of leading blocks, when a step runs as a cascade, and
the log-sum-exp merge of two partial results against attention over the union of their keys (float64)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attnserve.attention.cascade import MIN_PREFIX_TOKENS, MIN_REQS, common_prefix_blocks, use_cascade
from attnserve.kernels.merge_attn_states import merge_attn_states, merge_attn_states_torch


def _table(rows: list[list[int]]) -> np.ndarray:
    width = max(map(len, rows))
    return np.array([r + [0] * (width - len(r)) for r in rows], dtype=np.int32)


def test_common_prefix_counts_equal_leading_columns():
    table = _table([[7, 8, 9, 1, 2], [7, 8, 9, 3, 4], [7, 8, 5, 6, 10]])
    assert common_prefix_blocks(table, np.array([79, 79, 79]), 16) == 2


def test_common_prefix_ends_within_every_cached_context():
    # every row shares all five blocks, but one request has only 64 tokens cached before this step: 4 blocks
    table = _table([[1, 2, 3, 4, 5]] * 3)
    assert common_prefix_blocks(table, np.array([80, 80, 64]), 16) == 4
    # 63 cached tokens: block 3 is not whole in that context, so blocks 0-2 at most
    assert common_prefix_blocks(table, np.array([80, 63, 80]), 16) == 3


def test_first_block_differs_or_one_request_means_no_prefix():
    assert common_prefix_blocks(_table([[1, 2, 3], [9, 2, 3]]), np.array([48, 48]), 16) == 0
    assert common_prefix_blocks(_table([[1, 2, 3]]), np.array([48]), 16) == 0


def test_use_cascade_thresholds():
    blocks = MIN_PREFIX_TOKENS // 16
    assert use_cascade(MIN_REQS, blocks, 16)
    assert not use_cascade(MIN_REQS - 1, blocks, 16)
    assert not use_cascade(MIN_REQS, blocks - 1, 16)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float):
    """q (T, H, D), k/v (S, H, D) float64: output (T, H, D) and log-sum-exp (H, T)."""
    scores = torch.einsum("thd,shd->hts", q, k) * scale
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.einsum("hts,shd->thd", torch.softmax(scores, dim=-1), v)
    return out, lse


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_merge_equals_attention_over_the_union(dtype):
    g = torch.Generator().manual_seed(0)
    t, h, d, sa, sb = 5, 3, 64, 40, 7
    q, k, v = (torch.randn(n, h, d, generator=g, dtype=torch.float64) for n in (t, sa + sb, sa + sb))
    scale = 1 / math.sqrt(d)
    full, _ = _attend(q, k, v, scale)
    o_a, lse_a = _attend(q, k[:sa], v[:sa], scale)
    o_b, lse_b = _attend(q, k[sa:], v[sa:], scale)
    merged = merge_attn_states(o_a.to(dtype), lse_a.float(), o_b.to(dtype), lse_b.float())
    assert merged.dtype == dtype and merged.shape == (t, h, d)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(merged.double(), full, atol=tol, rtol=tol)


def test_merge_with_an_empty_part_returns_the_other():
    o = torch.randn(4, 2, 8)
    lse = torch.randn(2, 4)
    empty = torch.full((2, 4), float("-inf"))
    torch.testing.assert_close(merge_attn_states_torch(o, lse, torch.randn(4, 2, 8), empty), o)
    assert torch.equal(merge_attn_states_torch(o, empty, o, empty), torch.zeros_like(o))


def test_merge_writes_into_out():
    o_a, o_b, lse_a, lse_b = torch.randn(3, 2, 4), torch.randn(3, 2, 4), torch.randn(2, 3), torch.randn(2, 3)
    out = torch.empty(3, 2, 4)
    assert merge_attn_states(o_a, lse_a, o_b, lse_b, out) is out
    torch.testing.assert_close(out, merge_attn_states_torch(o_a, lse_a, o_b, lse_b))
