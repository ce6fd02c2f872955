"""FlashAttention 3's cascade call (``attention/cascade.py``): the shared prefix attended once by every query
token as one sequence (non-causal, through the paged kernel, with its own split plan), each request's suffix
separately, the two merged by log-sum-exp (``kernels/merge_attn_states.py``). Decode steps in CUDA graphs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from attnserve.attention.cascade import CascadePrefix
from attnserve.kernels.merge_attn_states import merge_attn_states

if TYPE_CHECKING:  # pragma: no cover
    from attnserve.attention.backends.flash_attn_calls import FlashAttentionCall


@dataclass
class PrefixCall:
    """FlashAttention 3's first call of a cascade step: every query token over the shared prefix (non-causal)."""

    prefix: CascadePrefix
    scheduler_metadata: torch.Tensor | None = None  # the prefix call's split plan (its split bound: the call's)


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
        num_splits=call.num_splits,
        **common,
    )
    o_suffix, lse_suffix, *_ = fa.flash_attn_with_kvcache(q, key_cache, value_cache, **call.paged_args(), **common)
    return merge_attn_states(o_prefix, lse_prefix, o_suffix, lse_suffix)
