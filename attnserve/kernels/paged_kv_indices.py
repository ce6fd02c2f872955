"""FlashInfer's page arguments (CSR form) from a step's sequence lengths and block table.

FlashInfer's paged kernels find a request's pages through three arrays: ``indptr`` (B + 1 cumulative page
counts), ``indices`` (the page ids of all requests back to back) and ``last_page_len`` (tokens in each
request's last page, 1..block_size). The kernel derives a request's context length from them:
``(indptr[i+1] - indptr[i] - 1) * block_size + last_page_len[i]``.

* :func:`host_pages` computes ``indptr`` and ``last_page_len`` on the host with numpy (what FlashInfer's
  ``plan()`` reads to schedule the kernel).
* :func:`device_pages` computes all three on the device from the device ``seq_lens`` and block table: one
  Triton kernel (a fixed-shape PyTorch fallback without Triton). It reads no host value and launches
  shapes fixed by the block table's shape, so it never synchronises with the host and can be captured in
  a CUDA graph, whose replays then rebuild the page arrays from the runner's static buffers.
"""

from __future__ import annotations

import numpy as np
import torch


def host_pages(
    seq_lens: np.ndarray, block_size: int, indptr: np.ndarray | None = None, last_page_len: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``indptr`` (n + 1,) and ``last_page_len`` (n,) int32 of ``n`` requests with context ``seq_lens``.

    Written into ``indptr`` / ``last_page_len`` when given (views of pinned buffers, say), at least n + 1 / n
    long; the returned arrays are their first n + 1 / n entries.
    """
    n = len(seq_lens)
    indptr = np.empty(n + 1, np.int32) if indptr is None else indptr[: n + 1]
    last_page_len = np.empty(n, np.int32) if last_page_len is None else last_page_len[:n]
    pages = (seq_lens.astype(np.int32, copy=False) + (block_size - 1)) // block_size
    indptr[0] = 0
    np.cumsum(pages, dtype=np.int32, out=indptr[1:])
    np.subtract(seq_lens, (pages - 1) * block_size, out=last_page_len, casting="unsafe")
    return indptr, last_page_len


def device_pages(
    seq_lens: torch.Tensor,  # (n,) int32
    block_table: torch.Tensor,  # (n, W) int32, rows contiguous
    block_size: int,
    indptr: torch.Tensor,  # (>= n + 1,) int32, out
    last_page_len: torch.Tensor,  # (>= n,) int32, out
    indices: torch.Tensor,  # (>= total pages + 1,) int32, out: the last entry is scratch
) -> None:
    """Write the page arrays of ``n`` requests into ``indptr[:n+1]``, ``last_page_len[:n]`` and the first
    ``indptr[n]`` entries of ``indices``; no host synchronisation. The last entry of ``indices`` may be
    overwritten (the PyTorch fallback parks the block-table entries past each request's pages there)."""
    if seq_lens.is_cuda:
        try:
            from attnserve.kernels.triton_paged_kv_indices import device_pages_triton
        except ImportError:
            pass
        else:
            device_pages_triton(seq_lens, block_table, block_size, indptr, last_page_len, indices)
            return
    device_pages_torch(seq_lens, block_table, block_size, indptr, last_page_len, indices)


def device_pages_torch(seq_lens, block_table, block_size, indptr, last_page_len, indices) -> None:
    """The PyTorch definition of :func:`device_pages`: fixed shapes (n x W), no data-dependent sizes."""
    n, width = block_table.shape
    pages = (seq_lens + (block_size - 1)) // block_size
    indptr[:1].zero_()
    torch.cumsum(pages, 0, dtype=torch.int32, out=indptr[1 : n + 1])
    torch.sub(seq_lens, (pages - 1) * block_size, out=last_page_len[:n])
    col = torch.arange(width, dtype=torch.int32, device=seq_lens.device)
    dest = torch.where(col[None, :] < pages[:, None], indptr[:n, None] + col[None, :], indices.numel() - 1)
    indices.scatter_(0, dest.reshape(-1).long(), block_table.reshape(-1).to(indices.dtype))
