"""FlashAttention 3's cascade calls (``attention/cascade.py``): the shared prefix attended once, each request's
suffix separately, the two merged by log-sum-exp (``kernels/merge_attn_states.py``).

* :func:`paged_cascade` (decode steps, in CUDA graphs too): the prefix through the paged kernel, every query
  token as one sequence (non-causal), with its own split plan.
* :func:`dense_cascade` (steps with prefills, eager): the prefix's K/V gathered into contiguous tensors
  (``P * Hkv * D`` elements each, per layer) for the dense varlen kernel, which loads them with TMA where FA3's
  paged kernel over 16-token pages cannot; the suffix through the fresh-prefill call when it is this step's
  tokens only, else the paged one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from attnserve.attention.cascade import CascadePrefix
from attnserve.kernels.merge_attn_states import merge_attn_states

if TYPE_CHECKING:  # pragma: no cover
    from attnserve.attention.backends.flash_attn import FlashAttentionCall


@dataclass
class PrefixCall:
    """FlashAttention 3's first call of a cascade step: every query token over the shared prefix (non-causal)."""

    prefix: CascadePrefix
    scheduler_metadata: torch.Tensor | None = None  # the prefix call's split plan (paged)
    # a step with prefills (eager): the prefix's K/V gathered into contiguous tensors and attended by the dense
    # varlen kernel (TMA loads; FA3's paged kernel cannot use them with 16-token pages); key_start_loc [0, P]
    dense: bool = False
    key_start_loc: torch.Tensor | None = None
    num_splits: int = 0
    page_size: int = 0


def paged_cascade(
    fa, q, key_cache, value_cache, call: FlashAttentionCall, scale: float, softcap: float
) -> torch.Tensor:
    """A cascade step (``attention/cascade.py``): every query over the shared prefix in one non-causal call,
    each request over its own suffix, merged by their log-sum-exp. 16-bit cache only (the builder's
    ``supports_cascade``)."""
    p = call.prefix
    common = dict(softmax_scale=scale, softcap=softcap, return_softmax_lse=True)
    o_prefix, lse_prefix, *_ = fa.flash_attn_with_kvcache(
        q,
        key_cache,
        value_cache,
        cache_seqlens=p.prefix.seq_lens,
        page_table=p.prefix.block_table,
        cu_seqlens_q=p.prefix.query_start_loc,
        max_seqlen_q=q.shape[0],
        causal=False,
        scheduler_metadata=p.scheduler_metadata,
        num_splits=p.num_splits,
        **common,
    )
    o_suffix, lse_suffix, *_ = fa.flash_attn_with_kvcache(
        q,
        key_cache,
        value_cache,
        cache_seqlens=call.seq_lens,
        page_table=call.block_table,
        cu_seqlens_q=call.query_start_loc,
        max_seqlen_q=call.max_query_len,
        causal=True,
        scheduler_metadata=call.scheduler_metadata,
        num_splits=call.num_splits,
        **common,
    )
    return merge_attn_states(o_prefix, lse_prefix, o_suffix, lse_suffix)


def dense_cascade(
    fa, q, k, v, key_cache, value_cache, call: FlashAttentionCall, scale: float, softcap: float
) -> torch.Tensor:
    """A step with prefills whose requests all start after the shared prefix: the prefix's K/V gathered
    (``P * Hkv * D`` elements each) and attended by every query in one dense non-causal call; each request's
    suffix by the fresh-prefill call (the suffix is this step's tokens) or the paged one; merged."""
    p = call.prefix
    blocks = p.prefix.block_table[0]
    key_prefix = key_cache.index_select(0, blocks).flatten(0, 1)
    value_prefix = value_cache.index_select(0, blocks).flatten(0, 1)
    o_prefix, lse_prefix = fa.flash_attn_varlen_func(
        q,
        key_prefix,
        value_prefix,
        p.prefix.query_start_loc,
        p.key_start_loc,
        q.shape[0],
        p.prefix.max_len,
        softmax_scale=scale,
        causal=False,
        softcap=softcap,
        return_attn_probs=True,
    )[:2]
    if call.fresh:
        o_suffix, lse_suffix = fa.flash_attn_varlen_func(
            q,
            k,
            v,
            call.query_start_loc,
            call.query_start_loc,
            call.max_query_len,
            call.max_query_len,
            softmax_scale=scale,
            causal=True,
            softcap=softcap,
            return_attn_probs=True,
        )[:2]
    else:
        o_suffix, lse_suffix = fa.flash_attn_with_kvcache(
            q,
            key_cache,
            value_cache,
            cache_seqlens=call.seq_lens,
            page_table=call.block_table,
            cu_seqlens_q=call.query_start_loc,
            max_seqlen_q=call.max_query_len,
            softmax_scale=scale,
            causal=True,
            softcap=softcap,
            scheduler_metadata=call.scheduler_metadata,
            return_softmax_lse=True,
        )[:2]
    return merge_attn_states(o_prefix, lse_prefix, o_suffix, lse_suffix)
