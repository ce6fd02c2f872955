"""How TRITON_ATTN's paged-attention kernel (``triton_attention.py``) cuts its work into tiles, on the host: the
query tiles of a step (rows of one KV head's query heads, at least 16 for ``tl.dot``) and the KV tile of its
online-softmax loop (a power of two of cache pages). Plain Python: the metadata builder plans a step with these,
and ``paged_attention`` launches with them.
"""

from __future__ import annotations

import torch

# tokens per KV tile of the attention loop (BLOCK_N) when the page is smaller: decode's loads and dots
# are then 64 tokens wide instead of one 16-token page per iteration ...
KV_TILE_TOKENS = 64
# ... as long as one K tile (BLOCK_N x HEAD_PAD elements) stays within 16 KiB: Triton stages K and V
# through shared memory, pipelined over 3 iterations by default (2 in decode launches:
# ``triton_attn._DECODE_LAUNCH``), so 16 KiB tiles keep a program near 40 KB (sm_90 build: 16-bit, head
# 128, 64 tokens: 39 KB, 152 registers). Wider tiles for float32 or head 256 would need 76-152 KB (more
# than sm_75/sm_8x's per-block limit, and spills for float32/256).
KV_TILE_BYTES = 16 * 1024


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= ``n`` (1 for n <= 1), as ``triton.next_power_of_2``."""
    return 1 << max(0, n - 1).bit_length()


def padded_head_size(head_size: int) -> int:
    """The head dimension as the kernel's tiles hold it: a power of two, at least 16."""
    return max(16, next_power_of_2(head_size))


def default_pages_per_tile(
    page_size: int, head_pad: int = 128, elem_bytes: int = 2, tile_tokens: int = KV_TILE_TOKENS
) -> int:
    """Pages per KV tile: the largest power of two <= ``tokens // page_size``, at least one, where
    ``tokens = min(tile_tokens, KV_TILE_BYTES // (head_pad * elem_bytes))``; ``elem_bytes`` is the larger
    of the query's and the cache's element sizes. 16-bit, head <= 128: pages of 16 -> 4, 32 -> 2, 64 and up
    -> 1 (pages that large are one page per tile); float32 or head 256: tiles of 32 tokens."""
    tokens = min(tile_tokens, KV_TILE_BYTES // (head_pad * elem_bytes))
    n = max(1, tokens // page_size)
    return 1 << (n.bit_length() - 1)


def kv_tile_tokens(page_size: int, head_size: int, elem_bytes: int) -> int:
    """Tokens per KV tile of the attention loop for this page size, head size and element size (the larger
    of the query's and the cache's): ``default_pages_per_tile`` pages, as ``paged_attention`` picks them."""
    return default_pages_per_tile(page_size, padded_head_size(head_size), elem_bytes) * page_size


def block_m_for(num_queries_per_kv: int) -> tuple[int, int]:
    """(BLOCK_M rows, BLOCK_Q query tokens) of a tile: at least 16 rows (tl.dot's minimum)."""
    block_m = max(16, next_power_of_2(num_queries_per_kv))
    return block_m, block_m // num_queries_per_kv


def query_tiles(
    query_start_loc_cpu: torch.Tensor, block_q: int, first_req: int = 0, last_req: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per tile of ``block_q`` query tokens: its request index and first token (relative to the request).

    Computed on the host once per step (the builder's job), over requests ``[first_req, last_req)``.
    """
    qsl = query_start_loc_cpu.tolist()
    last_req = len(qsl) - 1 if last_req is None else last_req
    seqs, starts = [], []
    for i in range(first_req, last_req):
        q_len = qsl[i + 1] - qsl[i]
        for s in range(0, q_len, block_q):
            seqs.append(i)
            starts.append(s)
    return torch.tensor(seqs, dtype=torch.int32), torch.tensor(starts, dtype=torch.int32)
