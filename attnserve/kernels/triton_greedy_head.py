"""Greedy decoding's LM head without its logits: ``argmax(hidden @ weight.T, dim=-1)`` in two Triton launches.

Shapes and dtypes: ``hidden`` (M, K) and ``weight`` (N, K) (the LM head or tied embedding: N is the vocabulary),
both float16 or bfloat16, K contiguous, M = 1..``MAX_M``; returns (M,) int64: for each row the index of the
first maximum of the row's logits as the model's dtype holds them (the float32 dot product rounded to
16 bits, as the LM head's output is), the value ``torch.argmax`` returns on those logits, except that a NaN
counts as +inf (as ``triton_argmax``).

Why: a greedy decode step computes the (M, N) logits (cuBLAS), writes them, and reads them back for the
argmax (``triton_argmax``, a second pass): at batch 64 of a 151936-token vocabulary, 19.4 MB written and
read and a second kernel. Here the first launch computes the LM head one tile of ``BLOCK_N`` vocabulary rows per program on tensor cores (up to
32 rows as ``triton_gemv``'s tensor-core path does, the weight tile as the MMA's M side and the rows padded to
16 or 32 as its N side, ``gemv_step``; from 33 rows with x's 64 padded rows as the M side), and each
program, instead of storing its (M, BLOCK_N) logits, stores per row the largest value of its tile and the
first column holding it; the second launch (one program per row) reduces the tiles' partials in column order.
Nothing of size (M, N) is written.

Structured outputs: with a grammar bitmask (``mask_words`` (C, W) int32, bit ``t % 32`` of word ``t // 32`` set =
token ``t`` allowed; ``mask_index`` (M,) int32, the bitmask row of each hidden row or -1 for a row it does not
constrain, None: row m is bitmask row m; tokens from ``mask_tokens`` on are never allowed in a constrained
row), launch 1 sets every token a row's bitmask does not allow to -inf before the tile's maximum: the tokens are
``torch.argmax`` of the masked logits (``grammar_bitmask.apply_bitmask_torch``), and a
constrained decode step launches what an unconstrained one does instead of the LM head, the mask and the argmax.

Launch 1 follows ``kernels/pdl.py``'s protocol: its first weight tile is loaded before the PDL wait. The
launch configurations (:class:`GreedyHeadConfig`) are measured at start-up by ``GemvPlan`` against the
LM head's own choice followed by ``triton_argmax``, per decode batch size; the fused path is used only where
it measured faster (the plan's timings and the engine A/B, ``benchmarks/gpu/bench_engine_variants.py``:
docs/benchmarks.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from attnserve.kernels import pdl
from attnserve.kernels.triton_common import INTERPRETED, pdl_wait, round_rne
from attnserve.kernels.triton_gemv import gemv_step, gemv_tile

MAX_M = 64  # rows: one padded row tile of 16, 32 or 64 per program
_NO_INDEX: tl.constexpr = tl.constexpr(2**31 - 1)  # larger than any column index
REDUCE_BLOCK = 512  # tile partials per step of the per-row reduction


@dataclass(frozen=True)
class GreedyHeadConfig:
    """Launch 1's tile: ``block_n`` vocabulary rows of the weight per program, ``block_k`` K elements per step."""

    block_n: int = 64
    block_k: int = 64
    num_warps: int = 4
    num_stages: int = 4

    def label(self) -> str:
        return f"greedy n{self.block_n} k{self.block_k} w{self.num_warps} st{self.num_stages}"


# the start-up plan's candidates: the best tensor-core tiles of the Qwen3-0.6B LM head at 16..64 rows (chosen
# by ``benchmarks/gpu/bench_gemv.py``: n64 k64 st4, n64 k128 st2-3, n128 k128 w8 st3 at 1 row), and a
# 256-row weight tile that reads the 64-row x tile (from L2) a quarter as often per weight byte
CANDIDATES = (
    GreedyHeadConfig(64, 64, 4, 4),
    GreedyHeadConfig(64, 128, 4, 3),
    GreedyHeadConfig(128, 64, 4, 4),
    GreedyHeadConfig(128, 128, 8, 3),
    GreedyHeadConfig(256, 64, 8, 3),
)


@triton.jit
def _dot_step(acc, w_ptrs, x_ptrs, k, K, k_offs, MASKED: tl.constexpr, SWAP: tl.constexpr, INTERPRET: tl.constexpr):
    """One BLOCK_K step at column ``k`` of the (BLOCK_M, BLOCK_N) logits tile: ``SWAP`` (up to 32 rows) keeps it
    transposed, (BLOCK_N, BLOCK_M), with the weight tile as the MMA's M side (``triton_gemv``'s "swap AB")."""
    if SWAP:
        acc = gemv_step(acc, w_ptrs, x_ptrs, k, K, k_offs, MASKED, True, "tf32", "none", False, INTERPRET)
    else:
        if MASKED:
            w = tl.load(w_ptrs + k, mask=k + k_offs < K, other=0.0)
            x = tl.load(x_ptrs + k, mask=k + k_offs < K, other=0.0)
        else:
            w = tl.load(w_ptrs + k)
            x = tl.load(x_ptrs + k)
        if INTERPRET:  # the interpreter's dot multiplies 16-bit floats' bits as integers
            acc = tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
        else:
            acc = tl.dot(x, tl.trans(w), acc)
    return acc


@triton.jit(do_not_specialize=["M", "stride_mask", "mask_covered"])  # one compile per tile, whatever the vocabulary
def _head_tiles_kernel(
    x_ptr,
    w_ptr,
    part_val_ptr,
    part_idx_ptr,
    logits_ptr,
    mask_words_ptr,
    mask_index_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_mask,
    mask_covered,
    n_tiles,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    SWAP: tl.constexpr,
    STORE_LOGITS: tl.constexpr,
    MASKED: tl.constexpr,
    HAS_MASK_INDEX: tl.constexpr,
    INTERPRET: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """Program n: the (M, BLOCK_N) logits of vocabulary rows [n * BLOCK_N, ...), rounded to the weight's dtype;
    per row its largest value and the first column holding it, at ``part_*[row * n_tiles + n]``.
    ``STORE_LOGITS`` (tests): also store the rounded logits at ``logits_ptr`` (M, N), unmasked. ``MASKED``: the
    grammar bitmask first (module docstring; ``mask_covered`` = the columns it can allow).

    Up to 32 rows the tile is computed transposed (``SWAP``, the launcher's ``BLOCK_M <= 32``: 16 or 32 padded
    rows as the MMA's N side); from 33 rows x's 64 rows are the MMA's M side, so that the reduction over the
    vocabulary runs along the accumulator's columns, within each warp, instead of across warps (faster: see
    docs/benchmarks.md)."""
    pid_n = tl.program_id(0)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    rows_m = tl.minimum(offs_m, M - 1)  # clamped, not masked (as triton_gemv): padded rows are never stored
    rows_n = tl.minimum(offs_n, N - 1).to(tl.int64)
    k_offs = offs_k[None, :]
    w_ptrs = w_ptr + rows_n[:, None] * stride_wn + k_offs  # (BLOCK_N, BLOCK_K)
    x_ptrs = x_ptr + rows_m[:, None] * stride_xm + k_offs  # (BLOCK_M, BLOCK_K)
    if SWAP:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_lo = 0
    k_main = K - K % BLOCK_K
    if USE_PDL and EVEN_K and SWAP:  # the first weight tile before the wait (a weight is no kernel's output)
        w_first = tl.load(w_ptrs)
        pdl_wait(USE_PDL)
        acc = gemv_tile(acc, w_first, x_ptrs, 0, K, k_offs, False, True, "tf32", "none", False, INTERPRET)
        k_lo = BLOCK_K
    else:
        pdl_wait(USE_PDL)
    for k in range(k_lo, k_main, BLOCK_K):
        acc = _dot_step(acc, w_ptrs, x_ptrs, k, K, k_offs, False, SWAP, INTERPRET)
    if not EVEN_K:
        acc = _dot_step(acc, w_ptrs, x_ptrs, k_main, K, k_offs, True, SWAP, INTERPRET)
    if SWAP:
        acc = tl.trans(acc)
    logits = round_rne(acc, w_ptr.dtype.element_ty, INTERPRET).to(tl.float32)  # (BLOCK_M, BLOCK_N): the LM head's bits
    if STORE_LOGITS:
        out_ptrs = logits_ptr + offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
        tl.store(out_ptrs, logits.to(logits_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))
    logits = tl.where(logits != logits, float("inf"), logits)  # NaN -> +inf
    logits = tl.where(offs_n[None, :] < N, logits, float("-inf"))
    if MASKED:  # a disallowed token is -inf, a NaN among them too (the mask comes before the argmax)
        mask_row = tl.load(mask_index_ptr + rows_m) if HAS_MASK_INDEX else rows_m  # (BLOCK_M,), -1: unconstrained
        constrained = mask_row >= 0
        cols = offs_n[None, :]
        word = tl.load(
            mask_words_ptr + mask_row[:, None].to(tl.int64) * stride_mask + (cols >> 5),
            mask=constrained[:, None] & (cols < mask_covered),
            other=0,
        )  # past ``mask_covered`` the word reads as 0: nothing there is allowed
        blocked = constrained[:, None] & (((word >> (cols & 31)) & 1) == 0)
        logits = tl.where(blocked, float("-inf"), logits)
    best = tl.max(logits, axis=1)  # (BLOCK_M,)
    first = tl.min(tl.where(logits == best[:, None], offs_n[None, :], _NO_INDEX), axis=1)
    tl.store(part_val_ptr + offs_m * n_tiles + pid_n, best, mask=offs_m < M)
    tl.store(part_idx_ptr + offs_m * n_tiles + pid_n, first, mask=offs_m < M)


@triton.jit
def _reduce_tiles_kernel(part_val_ptr, part_idx_ptr, out_ptr, n_tiles, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    """Program r: the first maximum over row r's tile partials (in column order), as int64 at ``out_ptr[r]``."""
    row = tl.program_id(0).to(tl.int64)
    pdl_wait(USE_PDL)
    offs = tl.arange(0, BLOCK)
    base_v = part_val_ptr + row * n_tiles
    base_i = part_idx_ptr + row * n_tiles
    best_v = tl.load(base_v + offs, mask=offs < n_tiles, other=float("-inf"))
    best_i = tl.load(base_i + offs, mask=offs < n_tiles, other=_NO_INDEX)
    for start in range(BLOCK, n_tiles, BLOCK):
        t = start + offs
        v = tl.load(base_v + t, mask=t < n_tiles, other=float("-inf"))
        i = tl.load(base_i + t, mask=t < n_tiles, other=_NO_INDEX)
        take = v > best_v  # strictly: a lane keeps its earliest tile's maximum
        best_v = tl.where(take, v, best_v)
        best_i = tl.where(take, i, best_i)
    m = tl.max(best_v, axis=0)
    tl.store(out_ptr + row, tl.min(tl.where(best_v == m, best_i, _NO_INDEX), axis=0).to(tl.int64))


def greedy_head(
    hidden: torch.Tensor,  # (M, K) float16 / bfloat16, M = 1..MAX_M
    weight: torch.Tensor,  # (N, K) same dtype, K contiguous
    config: GreedyHeadConfig | None = None,  # None: GreedyHeadConfig()
    logits_out: torch.Tensor | None = None,  # tests: (M, N) in the weight's dtype, receives the rounded logits
    mask_words: torch.Tensor | None = None,  # (C, W) int32: a grammar bitmask (module docstring)
    mask_index: torch.Tensor | None = None,  # (M,) int32: each row's bitmask row, -1 none; None: row m is row m
    mask_tokens: int = 0,  # the bitmask's vocabulary: tokens from here on are never allowed in a constrained row
) -> torch.Tensor:  # (M,) int64
    """``torch.argmax(F.linear(hidden, weight), dim=-1)`` without materialising the logits (module docstring);
    with ``mask_words``, the argmax of the logits that the grammar bitmask leaves. Raises ValueError for another
    dtype, mismatched shapes, M outside 1..MAX_M, N >= 2**31, an empty K, or a bitmask that is not int32 words
    with an index (or a row) for each hidden row."""
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"greedy_head takes hidden (M, K) and weight (N, K), got {tuple(hidden.shape)} and {tuple(weight.shape)}"
        )
    if hidden.dtype not in (torch.float16, torch.bfloat16) or weight.dtype != hidden.dtype:
        raise ValueError(
            f"greedy_head takes float16 or bfloat16 (both the same), got {hidden.dtype} and {weight.dtype}"
        )
    m, k = hidden.shape
    n = weight.shape[0]
    if not 1 <= m <= MAX_M or n >= 2**31 or n == 0 or k == 0:
        raise ValueError(
            f"greedy_head takes 1..{MAX_M} rows, 1..2**31-1 vocabulary rows and K >= 1, got M={m}, N={n}, K={k}"
        )
    if weight.stride(1) != 1:
        raise ValueError("greedy_head needs the weight's K dimension contiguous")
    if hidden.stride(1) != 1:
        hidden = hidden.contiguous()
    if mask_words is not None:
        _check_mask(mask_words, mask_index, m)
    cfg = config or GreedyHeadConfig()
    block_k = min(cfg.block_k, max(16, triton.next_power_of_2(k)))
    n_tiles = triton.cdiv(n, cfg.block_n)
    part_val = torch.empty((m, n_tiles), dtype=torch.float32, device=hidden.device)
    part_idx = torch.empty((m, n_tiles), dtype=torch.int32, device=hidden.device)
    out = torch.empty(m, dtype=torch.int64, device=hidden.device)
    launch = pdl.launch(hidden)
    block_m = max(16, triton.next_power_of_2(m))
    _head_tiles_kernel[(n_tiles,)](
        hidden,
        weight,
        part_val,
        part_idx,
        logits_out if logits_out is not None else out,
        out if mask_words is None else mask_words,  # unused without a mask
        mask_index if mask_index is not None else out,  # unused without an index
        m,
        n,
        k,
        hidden.stride(0),
        weight.stride(0),
        0 if mask_words is None else mask_words.stride(0),
        0 if mask_words is None else min(n, mask_tokens, mask_words.shape[1] * 32),
        n_tiles,
        BLOCK_M=block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=block_k,
        EVEN_K=k % block_k == 0,
        SWAP=block_m <= 32,
        STORE_LOGITS=logits_out is not None,
        MASKED=mask_words is not None,
        HAS_MASK_INDEX=mask_index is not None,
        INTERPRET=INTERPRETED,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **launch,
    )
    _reduce_tiles_kernel[(m,)](part_val, part_idx, out, n_tiles, BLOCK=REDUCE_BLOCK, **launch)
    return out


def _check_mask(words: torch.Tensor, index: torch.Tensor | None, m: int) -> None:
    """Raises ValueError unless ``words`` is (C, W) int32 with contiguous rows and ``index`` is None with C >= m or an
    (m,) int32 vector."""
    if words.dim() != 2 or words.dtype != torch.int32 or words.stride(1) != 1:
        raise ValueError(f"mask_words must be a (C, W) int32 matrix, got {tuple(words.shape)} {words.dtype}")
    if index is None and words.shape[0] < m:
        raise ValueError(f"{words.shape[0]} bitmask rows for {m} hidden rows and no mask_index")
    if index is not None and (index.shape != (m,) or index.dtype != torch.int32):
        raise ValueError(f"mask_index must be ({m},) int32, got {tuple(index.shape)} {index.dtype}")
