"""Mixture of experts on CPU: routing, the experts' definition against a token-by-token loop, the grouped GEMM's
schedule (``moe_align_block_size``) driving a block-by-block emulation of the Triton kernel, and the
tensor-parallel split of the experts' intermediate dimension."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnserve.distributed.group import TPGroup
from attnserve.kernels.moe import (
    fused_experts,
    fused_experts_reference,
    moe_activation,
    moe_align_block_size,
    topk_routing,
)
from attnserve.layers.moe import FusedMoE


def _naive(x, w13, w2, weights, ids, activation="silu", b13=None, b2=None):
    """One token and one slot at a time, float64."""
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            h = x[t].double() @ w13[e].double().T + (0 if b13 is None else b13[e].double())
            h = moe_activation(h[None], activation)[0]
            out[t] += weights[t, j].double() * (h @ w2[e].double().T + (0 if b2 is None else b2[e].double()))
    return out


def _case(T, E, H, I, k, seed=0, bias=False):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    x, w13, w2 = r(T, H), r(E, 2 * I, H) * 0.2, r(E, H, I) * 0.2
    weights, ids = topk_routing(r(T, E), k, renormalize=True)
    b13, b2 = (r(E, 2 * I), r(E, H)) if bias else (None, None)
    return x, w13, w2, weights, ids, b13, b2


def test_softmax_topk_routing_renormalized_or_not():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0], [0.5, 0.25, -1.0, 2.0]])
    probs = logits.softmax(-1)
    w, ids = topk_routing(logits, 2, renormalize=False)
    assert ids.dtype == torch.int32 and ids.tolist() == [[1, 2], [3, 0]]
    torch.testing.assert_close(w, probs.gather(1, ids.long()))
    w, _ = topk_routing(logits, 2, renormalize=True)
    torch.testing.assert_close(w.sum(-1), torch.ones(2))
    torch.testing.assert_close(w[0], torch.tensor([3.0, 2.0]).softmax(-1))


def test_gpt_oss_routing_is_topk_then_softmax():
    logits = torch.tensor([[0.1, 4.0, -2.0, 3.5, 1.0]])
    w, ids = topk_routing(logits, 3, renormalize=False, softmax_after_topk=True)
    assert ids.tolist() == [[1, 3, 4]]
    torch.testing.assert_close(w, torch.tensor([[4.0, 3.5, 1.0]]).softmax(-1))


def test_swigluoai_activation():
    gate = torch.tensor([[-10.0, 0.5, 9.0]])
    up = torch.tensor([[8.0, -0.25, -9.0]])
    got = moe_activation(torch.cat([gate, up], -1), "swigluoai", alpha=1.702, limit=7.0)
    g, u = gate.clamp(max=7.0), up.clamp(-7.0, 7.0)
    torch.testing.assert_close(got, (u + 1) * g * torch.sigmoid(1.702 * g))
    with pytest.raises(ValueError, match="'gelu' not supported"):
        moe_activation(torch.cat([gate, up], -1), "gelu")


@pytest.mark.parametrize(
    "T,E,k,activation,bias",
    [(1, 8, 2, "silu", False), (17, 8, 2, "silu", False), (33, 16, 4, "swigluoai", True), (5, 4, 4, "silu", True)],
)
def test_reference_matches_token_by_token_loop(T, E, k, activation, bias):
    x, w13, w2, weights, ids, b13, b2 = _case(T, E, 24, 20, k, bias=bias)
    got = fused_experts(x, w13, w2, weights, ids, activation, b13, b2)  # CPU: the definition
    torch.testing.assert_close(
        got.double(), _naive(x, w13, w2, weights, ids, activation, b13, b2), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("T,E,k,block", [(1, 8, 2, 16), (7, 8, 8, 4), (64, 128, 8, 16), (300, 16, 4, 64)])
def test_align_block_size_schedule(T, E, k, block):
    ids = torch.stack([torch.randperm(E, generator=torch.Generator().manual_seed(t))[:k] for t in range(T)]).int()
    sorted_ids, expert_ids, num_padded = moe_align_block_size(ids, block, E)
    n, used = T * k, int(num_padded)
    assert sorted_ids.numel() == n + E * (block - 1) and expert_ids.numel() == -(-sorted_ids.numel() // block)
    assert used % block == 0
    flat = ids.reshape(-1)
    real = sorted_ids[:used][sorted_ids[:used] < n]
    assert sorted(real.tolist()) == list(range(n))  # every pair once
    assert (sorted_ids[used:] == n).all()
    for b in range(used // block):  # each block: one expert's pairs, in token order
        pairs = sorted_ids[b * block : (b + 1) * block]
        pairs = pairs[pairs < n].long()
        assert (flat[pairs] == expert_ids[b]).all() and pairs.tolist() == sorted(pairs.tolist())
    counts = torch.bincount(flat.long(), minlength=E)
    assert used == int(((counts + block - 1) // block * block).sum())


def _emulated_grouped_gemm(a, b, bias, pair_weights, sorted_ids, expert_ids, num_padded, top_k, n_pairs, block):
    """What ``triton_moe._fused_moe_kernel`` computes, one row block at a time from the schedule."""
    out = torch.zeros(n_pairs, b.shape[1], dtype=a.dtype)
    for blk in range(int(num_padded) // block):
        pairs = sorted_ids[blk * block : (blk + 1) * block].long()
        pairs = pairs[pairs < n_pairs]
        e = int(expert_ids[blk])
        y = F.linear(a[pairs // top_k], b[e], None if bias is None else bias[e])
        out[pairs] = y if pair_weights is None else (y.float() * pair_weights[pairs, None]).to(a.dtype)
    return out


@pytest.mark.parametrize("T,E,k,block", [(9, 8, 2, 4), (40, 16, 4, 16)])
def test_schedule_drives_the_grouped_gemm_to_the_reference(T, E, k, block):
    x, w13, w2, weights, ids, b13, b2 = _case(T, E, 16, 12, k, bias=True)
    sched = moe_align_block_size(ids, block, E)
    h = _emulated_grouped_gemm(x, w13, b13, None, *sched, k, T * k, block)
    y = _emulated_grouped_gemm(moe_activation(h, "swigluoai"), w2, b2, weights.reshape(-1), *sched, 1, T * k, block)
    got = y.view(T, k, -1).sum(1)
    torch.testing.assert_close(got, fused_experts_reference(x, w13, w2, weights, ids, "swigluoai", b13, b2))


def test_tensor_parallel_split_sums_to_the_whole():
    """Two ranks' experts, each with half of every expert's intermediate dimension loaded from the full
    checkpoint tensors (uneven: 6 and 5 of 11), give partial outputs whose sum (the all-reduce) is the one-rank output."""
    E, H, I, k, T = 4, 16, 11, 2, 6  # I odd: 6 + 5 columns
    g = torch.Generator().manual_seed(3)
    gate_w, up_w, down_w = (
        torch.randn(E, I, H, generator=g),
        torch.randn(E, I, H, generator=g),
        torch.randn(E, H, I, generator=g),
    )
    down_b = torch.randn(E, H, generator=g)
    x, logits = torch.randn(T, H, generator=g), torch.randn(T, E, generator=g)

    def layer(tp: TPGroup) -> FusedMoE:
        m = FusedMoE(E, k, H, I, bias=True, tp=tp)
        m.w13_bias.data.zero_()
        for e in range(E):
            m.weight_loader(m.w13_weight, gate_w[e], "w1", e)
            m.weight_loader(m.w13_weight, up_w[e], "w3", e)
            m.weight_loader(m.w2_weight, down_w[e], "w2", e)
        m.weight_loader(m.w2_bias, down_b, "w2")  # all experts at once
        return m

    whole = layer(TPGroup(0, 1))(x, logits)
    parts = []
    for rank in range(2):
        m = layer(TPGroup(rank, 2))
        width = 6 - rank
        assert m.w13_weight.shape == (E, 2 * width, H) and m.w2_weight.shape == (E, H, width)
        w, ids = topk_routing(logits, k, True)
        parts.append(
            fused_experts(x, m.w13_weight, m.w2_weight, w, ids, "silu", m.w13_bias, m.w2_bias if rank == 0 else None)
        )  # FusedMoE.forward without the all-reduce
    torch.testing.assert_close(parts[0] + parts[1], whole, rtol=1e-5, atol=1e-5)
