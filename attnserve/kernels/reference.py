"""Plain-PyTorch paged attention: the oracle every backend is tested against.

Written for clarity, not speed: one request at a time, float32 math, explicit masks. The semantics are
those of causal decoder self-attention over a paged KV cache (vLLM's
``tests/kernels/attention/test_flash_attn.py::ref_paged_attn``), with an optional sliding window,
tanh logits soft cap and a learned sink logit per head (gpt-oss: a column of the softmax with no value).
"""

from __future__ import annotations

import torch


def gather_kv(
    kv_cache: torch.Tensor,  # (2, num_blocks, block_size, Hkv, D)
    block_ids: torch.Tensor,  # (n_blocks,) int physical block ids of one request, in order
    seq_len: int,
) -> tuple[torch.Tensor, torch.Tensor]:  # two (seq_len, Hkv, D)
    """The first ``seq_len`` keys and values of one request, gathered from its blocks."""
    block_size = kv_cache.shape[2]
    n_blocks = (seq_len + block_size - 1) // block_size
    ids = block_ids[:n_blocks].long()
    k = kv_cache[0, ids].reshape(-1, *kv_cache.shape[3:])[:seq_len]
    v = kv_cache[1, ids].reshape(-1, *kv_cache.shape[3:])[:seq_len]
    return k, v


def causal_mask(
    query_len: int, seq_len: int, sliding_window: int | None, device: torch.device | str = "cpu"
) -> torch.Tensor:  # (query_len, seq_len) bool, True = attend
    """Mask for queries that are the last ``query_len`` of ``seq_len`` positions.

    Query j sits at position ``seq_len - query_len + j`` and sees keys at positions <= its own; with a
    sliding window W it sees only the W most recent of those (itself included), as in Mistral.
    """
    q_pos = torch.arange(seq_len - query_len, seq_len, device=device)[:, None]
    k_pos = torch.arange(seq_len, device=device)[None, :]
    mask = k_pos <= q_pos
    if sliding_window is not None:
        mask &= k_pos > q_pos - sliding_window
    return mask


def softmax_with_sinks(scores: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
    """``softmax(scores, -1)``; with ``sinks`` (broadcast to ``scores[..., :1]``), the softmax over the scores and
    one extra logit per row, that column then dropped (rows sum to less than 1)."""
    if sinks is None:
        return scores.softmax(dim=-1)
    column = sinks.to(scores.dtype).expand(*scores.shape[:-1], 1)
    return torch.cat([scores, column], dim=-1).softmax(dim=-1)[..., :-1]


def reference_paged_attention(
    query: torch.Tensor,  # (T, Hq, D)
    kv_cache: torch.Tensor,  # (2, num_blocks, block_size, Hkv, D), already holding this step's K/V
    query_start_loc: torch.Tensor,  # (B + 1,) int
    seq_lens: torch.Tensor,  # (B,) int, context length of each request including this step's tokens
    block_table: torch.Tensor,  # (B, max_blocks) int
    scale: float,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    sinks: torch.Tensor | None = None,  # (Hq,): each head's sink logit, in the softmax's denominator only
) -> torch.Tensor:  # (T, Hq, D), query's dtype
    """Attention of each request's query tokens over its cached context, computed in float32 (float64 when
    ``query`` is float64: the oracle of the fp8 tests)."""
    out = torch.empty_like(query)
    num_heads, num_kv_heads = query.shape[1], kv_cache.shape[3]
    work = torch.float64 if query.dtype == torch.float64 else torch.float32
    qsl = query_start_loc.tolist()
    for i, seq_len in enumerate(seq_lens.tolist()):
        q = query[qsl[i] : qsl[i + 1]].to(work)  # (q_len, Hq, D)
        k, v = gather_kv(kv_cache, block_table[i].to(kv_cache.device), seq_len)
        k = k.to(work).repeat_interleave(num_heads // num_kv_heads, dim=1)
        v = v.to(work).repeat_interleave(num_heads // num_kv_heads, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale
        if logits_soft_cap is not None:
            scores = logits_soft_cap * torch.tanh(scores / logits_soft_cap)
        mask = causal_mask(q.shape[0], seq_len, sliding_window, query.device)
        scores = scores.masked_fill(~mask, float("-inf"))
        probs = softmax_with_sinks(scores, None if sinks is None else sinks.float()[:, None, None])
        out[qsl[i] : qsl[i + 1]] = torch.einsum("hqk,khd->qhd", probs, v).to(query.dtype)
    return out
