"""Row-wise argmax of a logits matrix in one Triton launch: greedy sampling's last kernel of a decode step.

Shapes and dtypes: ``x`` (B, V) float32, float16 or bfloat16, last dim contiguous; returns (B,) int64, the
index of each row's first maximum, as ``torch.argmax(x, dim=-1)`` returns it, except that a NaN counts as
+inf (torch takes NaN as larger than +inf: the two differ only on a row holding both).

Why: ``torch.argmax`` reads a decode step's (B, vocab) logits far below the memory bandwidth
(``benchmarks/gpu/profile_engine_steps.py``; figure in docs/benchmarks.md). Here each row's
columns are cut into ``splits`` chunks so that about 4 programs per SM stream them (a 64-row step: 9 chunks
of 17408 columns; one row: 149 chunks of 1024). Each program keeps per lane the first maximum it sees
(strictly greater replaces), then takes the largest value and, among lanes holding it, the smallest index.
The split reduction is the one :mod:`attnserve.kernels.triton_gemv` uses (the CUDA samples'
``threadFenceReduction``): each chunk writes its (max, index) to a workspace and takes a ticket from a
per-row counter; the program that draws the last ticket reduces the chunks in column order (so the first
maximum wins whichever chunk finished last), writes the index and resets the counter. No second launch, no
host sync: safe inside a CUDA graph. The counters are one persistent int32 buffer per device
(``triton_common.ticket_counters``), so launches on one device must not run concurrently on different streams.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from attnserve.kernels import pdl
from attnserve.kernels.triton_common import TICKETS, pdl_wait, ticket_counters

BLOCK = 1024  # columns per program step: 8 per thread of 4 warps (one 16-byte load of 16-bit logits)
PROGRAMS_PER_SM = 4
MAX_COLS = 2**31 - 1  # column indices are int32
_NO_INDEX: tl.constexpr = tl.constexpr(2**31 - 1)  # larger than any column index


@functools.cache
def _num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 132


def split_columns(rows: int, cols: int, num_sms: int) -> tuple[int, int]:
    """(splits, chunk): each row's ``cols`` cut into ``splits`` chunks of ``chunk`` columns (a multiple of
    BLOCK; the last chunk may be shorter), about ``PROGRAMS_PER_SM * num_sms`` programs in all."""
    splits = max(1, min(triton.cdiv(PROGRAMS_PER_SM * num_sms, max(rows, 1)), triton.cdiv(cols, BLOCK)))
    chunk = triton.cdiv(triton.cdiv(cols, splits), BLOCK) * BLOCK
    return triton.cdiv(cols, chunk), chunk


# one compiled kernel (split and unsplit) whatever the row count: the split count is not specialized and the
# final reduction's width is the most chunks a row of ``n_cols`` can have on the device (``splits_pad``), so
# an eager step's row count (a prefill step's requests) compiles nothing mid-run
@triton.jit(do_not_specialize=["splits"])
def _argmax_kernel(
    x_ptr,
    out_ptr,
    part_val_ptr,
    part_idx_ptr,
    count_ptr,
    n_cols,
    stride_row,
    chunk,
    splits,
    BLOCK: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    SPLIT: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """Grid (rows, splits): program (r, s) scans columns [s * chunk, min((s + 1) * chunk, n_cols)) of row r."""
    row = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    pdl_wait(USE_PDL)
    offs = tl.arange(0, BLOCK)
    lo = split * chunk
    hi = tl.minimum(lo + chunk, n_cols)
    base = x_ptr + row * stride_row
    best_i = lo + offs
    best_v = tl.load(base + best_i, mask=best_i < hi, other=float("-inf")).to(tl.float32)
    best_v = tl.where(best_v != best_v, float("inf"), best_v)  # NaN -> +inf
    for start in range(lo + BLOCK, hi, BLOCK):
        cols = start + offs
        v = tl.load(base + cols, mask=cols < hi, other=float("-inf")).to(tl.float32)
        v = tl.where(v != v, float("inf"), v)
        take = v > best_v  # strictly: each lane keeps its first maximum
        best_v = tl.where(take, v, best_v)
        best_i = tl.where(take, cols, best_i)
    m = tl.max(best_v, axis=0)
    i = tl.min(tl.where(best_v == m, best_i, _NO_INDEX), axis=0)
    if not SPLIT:
        tl.store(out_ptr + row, i.to(tl.int64))
    else:
        tl.store(part_val_ptr + row * splits + split, m)
        tl.store(part_idx_ptr + row * splits + split, i)
        # the partial is stored before the ticket (a CTA barrier, then the atomic's release at GPU scope);
        # the last chunk's loads come after its acquire
        tl.debug_barrier()
        ticket = tl.atomic_add(count_ptr + row, 1, sem="acq_rel", scope="gpu")
        if ticket == splits - 1:
            s = tl.arange(0, SPLITS_PAD)
            vals = tl.load(part_val_ptr + row * splits + s, mask=s < splits, other=float("-inf"), cache_modifier=".cg")
            idx = tl.load(part_idx_ptr + row * splits + s, mask=s < splits, other=_NO_INDEX, cache_modifier=".cg")
            m = tl.max(vals, axis=0)
            # chunks are in column order: the smallest index holding the maximum is the first maximum
            i = tl.min(tl.where(vals == m, idx, _NO_INDEX), axis=0)
            tl.store(out_ptr + row, i.to(tl.int64))
            tl.atomic_xchg(count_ptr + row, 0)  # ready for the next launch


def splits_pad(cols: int, num_sms: int) -> int:
    """The final reduction's width: the next power of two of the most chunks ``split_columns`` makes of a row
    of ``cols`` columns on ``num_sms`` SMs (one row), at least 2."""
    return max(2, triton.next_power_of_2(split_columns(1, cols, num_sms)[0]))


def argmax(x: torch.Tensor) -> torch.Tensor:  # (B,) int64
    """``torch.argmax(x, dim=-1)`` of a (B, V) float32/float16/bfloat16 matrix (see the module docstring for
    NaN). Raises ValueError for another rank or dtype, or V >= 2**31."""
    if x.dim() != 2 or x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"argmax takes a (B, V) float32/float16/bfloat16 matrix, got {tuple(x.shape)} {x.dtype}")
    rows, cols = x.shape
    if cols > MAX_COLS:
        raise ValueError(f"argmax takes fewer than 2**31 columns, got {cols}")
    if x.stride(1) != 1:
        x = x.contiguous()
    out = torch.empty(rows, dtype=torch.int64, device=x.device)
    if rows == 0:
        return out
    if cols == 0:
        raise ValueError("argmax of an empty row")
    num_sms = _num_sms(x.device)
    splits, chunk = split_columns(rows, cols, num_sms)
    if splits > 1 and rows <= TICKETS:
        part_val = torch.empty(rows * splits, dtype=torch.float32, device=x.device)
        part_idx = torch.empty(rows * splits, dtype=torch.int32, device=x.device)
        count = ticket_counters("triton_argmax", x.device)
    else:
        splits, chunk = 1, cols
        part_val = part_idx = count = out  # unused
    _argmax_kernel[(rows, splits)](
        x,
        out,
        part_val,
        part_idx,
        count,
        cols,
        x.stride(0),
        chunk,
        splits,
        BLOCK=BLOCK,
        SPLITS_PAD=splits_pad(cols, num_sms),
        SPLIT=splits > 1,
        **pdl.launch(x),
    )
    return out
