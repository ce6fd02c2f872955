"""``device_pages`` as one Triton kernel: one program per request.

Program ``r`` sums the page counts of requests ``0..r-1`` (its start in ``indices``; O(n) loads per
program, O(n^2) in all: a few microseconds at the batch sizes a step has), writes
``indptr[r + 1]`` and ``last_page_len[r]``, and copies its ``ceil(seq_len / block_size)`` block-table
entries. Nothing depends on another program, nothing is read back by the host, and the grid is the number
of requests: capturable in a CUDA graph. Importing this module imports Triton.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _device_pages_kernel(
    seq_lens_ptr,
    table_ptr,
    table_stride,
    indptr_ptr,
    last_ptr,
    indices_ptr,
    PAGE: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    r = tl.program_id(0)
    start = r * 0
    for j in range(0, r, BLOCK_R):  # pages of the requests before this one
        offs = j + tl.arange(0, BLOCK_R)
        before = tl.load(seq_lens_ptr + offs, mask=offs < r, other=0)
        start += tl.sum((before + (PAGE - 1)) // PAGE, axis=0)
    seq_len = tl.load(seq_lens_ptr + r)
    pages = (seq_len + (PAGE - 1)) // PAGE
    tl.store(indptr_ptr + r + 1, start + pages)
    if r == 0:
        tl.store(indptr_ptr, start)  # start == 0 for the first request
    tl.store(last_ptr + r, seq_len - (pages - 1) * PAGE)
    row = table_ptr + r.to(tl.int64) * table_stride
    for i in range(0, pages, BLOCK_P):
        o = i + tl.arange(0, BLOCK_P)
        m = o < pages
        tl.store(indices_ptr + start + o, tl.load(row + o, mask=m), mask=m)


def device_pages_triton(
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    block_size: int,
    indptr: torch.Tensor,
    last_page_len: torch.Tensor,
    indices: torch.Tensor,
) -> None:
    n = seq_lens.shape[0]
    if n == 0:
        indptr[:1].zero_()
        return
    assert block_table.stride(1) == 1 and seq_lens.is_contiguous()
    _device_pages_kernel[(n,)](
        seq_lens,
        block_table,
        block_table.stride(0),
        indptr,
        last_page_len,
        indices,
        PAGE=block_size,
        BLOCK_R=256,
        BLOCK_P=128,  # one compiled kernel for every batch size
    )
