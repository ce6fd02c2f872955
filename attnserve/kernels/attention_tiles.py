"""How TRITON_ATTN's paged-attention kernel (``triton_attention.py``) cuts its work into tiles, on the host: the
query tiles of a step (rows of one KV head's query heads, at least 16 for ``tl.dot``) and the KV tile of its
online-softmax loop (a power of two of cache pages), and the way an fp8 KV tile reaches its dots. Plain Python: the metadata builder plans a step with these,
and ``paged_attention`` launches with them.
"""

from __future__ import annotations

import torch

# tokens per KV tile of the attention loop (BLOCK_N) when the page is smaller: decode's loads and dots
# are then 64 tokens wide instead of one 16-token page per iteration ...
KV_TILE_TOKENS = 64
# ... as long as one K tile (BLOCK_N x HEAD_PAD elements) stays within 16 KiB: Triton stages K and V
# through shared memory, pipelined over 3 iterations by default (2 in decode launches:
# ``triton_attn_plan._DECODE_LAUNCH``), so 16 KiB tiles keep a program near 40 KB (sm_90 build: 16-bit, head
# 128, 64 tokens: 39 KB, 152 registers). Wider tiles for float32 or head 256 would need 76-152 KB (more
# than sm_75/sm_8x's per-block limit, and spills for float32/256).
KV_TILE_BYTES = 16 * 1024
# fp8 caches with 16-bit queries: tiles of this many tokens, within KV_TILE_BYTES of fp8 (a 16-bit 64-token
# tile's bytes), so that an iteration loads as many bytes as the 16-bit kernel's
FP8_KV_TILE_TOKENS = 128


# How the kernel turns an fp8 K/V tile into dot operands (its ``FP8_DOT``; ``paged_attention(fp8_dot=)``):
# "scaled": each element to float32, times its scale, to the query's dtype (the first version);
# "cast": to the query's dtype, the scales folded into the softmax scale (k) and the output (v);
# "f16": to float16 (sm_89+: one cvt per two values), the query to float16 once and the probabilities to
#   float16: both dots in fp16 with float32 accumulation, scales folded. Triton converts after loading a
#   tile from shared memory in the dot's layout, which for V (tokens strided) is one byte per load;
# "f16v": V converted in the layout it was loaded in (16 bytes a load; a PTX cvt that Triton leaves in
#   place), then moved to the dot's layout as float16; "f16kv": K too;
# "f16bits": the bits moved with integer ops (e4m3 lands as value * 2^-8: folded into the scales);
# "f16asm", "f16asmv", "f16asmkv": those bit moves in PTX, four bytes at a time, placed as "f16", "f16v",
#   "f16kv". The interpreter runs the PTX variants' conversions in Triton ops.
FP8_DOT_MODES = ("scaled", "cast", "f16", "f16v", "f16kv", "f16bits", "f16asm", "f16asmv", "f16asmkv")


def default_fp8_dot(query_dtype: torch.dtype) -> str:
    """The fp8 path for this query dtype: 16-bit queries dot in float16; float32 ones read fp8 as float32."""
    return "cast" if query_dtype == torch.float32 else "f16v"


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= ``n`` (1 for n <= 1), as ``triton.next_power_of_2``."""
    return 1 << max(0, n - 1).bit_length()


def padded_head_size(head_size: int) -> int:
    """The head dimension as the kernel's tiles hold it: a power of two, at least 16."""
    return max(16, next_power_of_2(head_size))


def default_pages_per_tile(
    page_size: int,
    head_pad: int = 128,
    elem_bytes: int = 2,
    tile_tokens: int = KV_TILE_TOKENS,
    kv_elem_bytes: int | None = None,
) -> int:
    """Pages per KV tile: the largest power of two <= ``tokens // page_size``, at least one, where
    ``tokens = min(tile_tokens, KV_TILE_BYTES // (head_pad * elem_bytes))``; ``elem_bytes`` is the larger
    of the query's and the cache's element sizes. 16-bit, head <= 128: pages of 16 -> 4, 32 -> 2, 64 and up
    -> 1 (pages that large are one page per tile); float32 or head 256: tiles of 32 tokens.
    ``kv_elem_bytes`` 1 (an fp8 cache) with 16-bit queries: ``FP8_KV_TILE_TOKENS`` in place of ``tile_tokens``
    and the cache's bytes in the cap."""
    if kv_elem_bytes == 1 and elem_bytes <= 2:
        tile_tokens, elem_bytes = FP8_KV_TILE_TOKENS, 1
    tokens = min(tile_tokens, KV_TILE_BYTES // (head_pad * elem_bytes))
    n = max(1, tokens // page_size)
    return 1 << (n.bit_length() - 1)


def kv_tile_tokens(page_size: int, head_size: int, elem_bytes: int, kv_elem_bytes: int | None = None) -> int:
    """Tokens per KV tile of the attention loop for this page size, head size and element size (the larger
    of the query's and the cache's; ``kv_elem_bytes``: the cache's): ``default_pages_per_tile`` pages, as
    ``paged_attention`` picks them."""
    return (
        default_pages_per_tile(page_size, padded_head_size(head_size), elem_bytes, kv_elem_bytes=kv_elem_bytes)
        * page_size
    )


def block_m_for(num_queries_per_kv: int, rows: int = 16) -> tuple[int, int]:
    """(BLOCK_M rows, BLOCK_Q query tokens) of a tile: at least ``rows`` rows (a power of two; 16: mma's
    smallest M, the engine's tiles), and at least one token's query heads."""
    block_m = max(rows, next_power_of_2(num_queries_per_kv))
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
