"""Cascade attention: a decode step whose requests all begin with the same KV blocks reads them once.

With prefix caching, requests that share a prompt prefix share its KV blocks (the first columns of their block
tables hold the same block ids). A plain decode step reads those blocks once per request; a cascade step
attends every query token to the shared prefix in one non-causal call (all query tokens as one sequence), each
request to its own suffix in a second call, and merges the two by their log-sum-exp
(``kernels/merge_attn_states.py``). vLLM does the same for FlashAttention (``cascade_attention`` in
``vllm/v1/attention/backends/flash_attn.py``); FlashInfer calls it a multi-level cascade.

:func:`common_prefix_blocks` finds the shared run on the host from the step's block table; the runner uses it
when the run is at least :data:`MIN_PREFIX_TOKENS` long and the step has at least :data:`MIN_REQS` requests
(vLLM's thresholds), and the backend's builder says it can (``AttentionMetadataBuilder.supports_cascade``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

MIN_PREFIX_TOKENS = 256  # a shorter shared prefix is not worth the second call and the merge
MIN_REQS = 8  # fewer requests read the prefix few times over


@dataclass
class CascadePrefix:
    """The prefix every request of a decode step shares, for the backend's first (prefix) call. With it,
    ``CommonAttentionMetadata.block_table`` and ``seq_lens`` describe each request's suffix only."""

    block_table: torch.Tensor  # (1, W) int32 on device: the prefix's block ids, in order
    seq_lens: torch.Tensor  # (1,) int32 on device: the prefix's length in tokens (whole blocks)
    query_start_loc: torch.Tensor  # (2,) int32 on device: [0, T], every query token as one sequence
    max_len: int  # bound on the prefix's length in tokens (the host-side plan's bound)


def common_prefix_blocks(block_table: np.ndarray, context_lens: np.ndarray, block_size: int) -> int:
    """The number of leading block-table columns that hold the same block id in every row (B, W) and lie
    wholly within every request's context before this step (``context_lens`` (B,): tokens already in the cache;
    a decode's is its length - 1), so every query token comes after the prefix. 0 when B < 2."""
    if len(context_lens) < 2:
        return 0
    limit = int(np.asarray(context_lens).min() // block_size)
    if limit <= 0:
        return 0
    head = block_table[:, :limit]
    same = (head == head[0]).all(axis=0)
    return limit if same.all() else int(np.argmin(same))


def use_cascade(num_reqs: int, prefix_blocks: int, block_size: int) -> bool:
    """Whether a decode step of ``num_reqs`` requests sharing ``prefix_blocks`` blocks runs as a cascade."""
    return num_reqs >= MIN_REQS and prefix_blocks * block_size >= MIN_PREFIX_TOKENS
