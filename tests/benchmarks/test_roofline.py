"""The roofline formula: step bytes, limits, % of limit, weight bytes of tied and untied models."""

from __future__ import annotations

import pytest
import torch

from attnserve.benchmarks.roofline import Roofline, kv_bytes_per_token, mean_decode_context, measure_copy_bandwidth
from attnserve.model_executor.weight_bytes import decode_weight_bytes, moe_expert_bytes


def test_step_bytes_and_limits():
    r = Roofline(copy_bandwidth=1e9, weight_bytes=1000, kv_bytes_per_token=10)
    assert r.step_bytes([100, 50]) == 1000 + 150 * 10
    assert r.step_limit_s([100, 50]) == pytest.approx(2500 / 1e9)
    assert r.run_limit_s(num_steps=3, kv_tokens_read=200) == pytest.approx((3000 + 2000) / 1e9)
    row = r.row(limit_s=1e-3, measured_s=4e-3)
    assert row.pct_of_limit == pytest.approx(25.0) and row.copy_bandwidth_GBps == 1.0
    assert r.row(1e-3, None).pct_of_limit is None


def test_kv_bytes_and_mean_context():
    assert kv_bytes_per_token(num_layers=2, num_kv_heads=8, head_size=128, dtype=torch.bfloat16) == 2 * 2 * 8 * 128 * 2
    assert mean_decode_context(100, 11) == 105.5  # steps read 101..110 tokens
    assert mean_decode_context(100, 1) == 100


class _Tiny(torch.nn.Module):
    def __init__(self, tied: bool) -> None:
        super().__init__()
        self.tie_word_embeddings = tied
        self.embed = torch.nn.Embedding(100, 8)
        self.pos = torch.nn.Embedding(10, 8)
        self.proj = torch.nn.Linear(8, 8, bias=False)
        if not tied:
            self.head = torch.nn.Linear(8, 100, bias=False)


def test_decode_weight_bytes_counts_the_token_table_only_when_tied():
    # untied: proj + head; the embedding tables are read only for the batch's rows
    assert decode_weight_bytes(_Tiny(tied=False)) == (64 + 800) * 4
    # tied: the head reads the whole token table; the position table is still not counted
    assert decode_weight_bytes(_Tiny(tied=True)) == (64 + 800) * 4


def test_copy_bandwidth_is_positive():
    assert measure_copy_bandwidth("cpu", nbytes=8 << 20, repeats=3) > 1e8


def test_moe_step_reads_the_expected_share_of_the_experts():
    from attnserve.layers.moe import FusedMoE

    moe = torch.nn.Sequential(FusedMoE(8, 2, 4, 6), FusedMoE(8, 2, 4, 6))
    assert moe_expert_bytes(moe) == (2 * 8 * (12 * 4 + 4 * 6) * 4, 8, 2)
    assert moe_expert_bytes(_Tiny(tied=False)) == (0, 0, 0)
    r = Roofline(
        copy_bandwidth=1e9,
        weight_bytes=1000 + 800,
        kv_bytes_per_token=10,
        expert_bytes=800,
        num_experts=8,
        experts_per_token=2,
    )
    assert r.step_bytes([100]) == 1000 + 200 + 1000  # one token: k / E of the experts
    assert r.step_bytes([1, 1]) == 1000 + round(800 * (1 - 0.75**2)) + 20
    assert r.step_bytes([1] * 64) == 1000 + round(800 * (1 - 0.75**64)) + 640
