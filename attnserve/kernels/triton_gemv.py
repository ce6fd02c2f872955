"""A Triton GEMV for decode: ``y = x @ weight.T (+ bias)`` for a few rows of ``x`` (M = 1..64).

Shapes and dtypes: ``x`` (M, K) and ``weight`` (N, K), both float32, float16 or bfloat16 (the same dtype),
K contiguous (``nn.Linear``'s layout, what ``F.linear`` takes); ``bias`` (N,) or None; ``y`` (M, N) in x's
dtype. Products are summed in float32 and rounded once, after the bias, as cuBLAS does.

Why: at batch 1..64 (the CUDA-graph decode buckets) a linear layer reads its whole weight to produce a few
outputs (2 * 64 FLOPs per weight byte is far below the tensor cores' ratio), so its time is the weight bytes
over memory bandwidth, which cuBLAS's small-M kernels do not reach for small matrices (docs/benchmarks.md).
This kernel is the usual memory-bound design, as in vLLM's ROCm "skinny GEMMs" for small batches
(``csrc/rocm/skinny_gemms.cu``, ``wvSplitK``, switched by ``VLLM_ROCM_USE_SKINNY_GEMM``): each program
streams a ``BLOCK_N x BLOCK_K`` tile of the weight per step with 16-byte loads along K, uses it for every
row of x (the weight is read once for all M rows), and K is split over ``SPLIT_K`` programs when N alone
gives too few programs to fill the GPU.

Two ways to multiply a tile (``GemvConfig.dot``):
- FMA (``dot=False``): elementwise products accumulated in a (BLOCK_M, BLOCK_N, BLOCK_K) float32 register
  tile, reduced over K once at the end (no cross-lane shuffles in the loop). The default for M <= 2; only
  up to ``MAX_FMA_M`` = 16 rows (past that the register tile, BLOCK_M times taller, no longer fits).
- tensor cores (``dot=True``): ``tl.dot(w_tile, x_tile.T)`` with the weight as the MMA's M side and x's
  rows padded to a power of two >= 16 (16, 32 or 64) as its N side ("swap AB"), so a tile of 64+ weight
  rows is one MMA operand; the loads are then pipelined ``num_stages`` deep through shared memory
  (``(BLOCK_N + BLOCK_M) * BLOCK_K`` elements per stage). The default for M >= 3 in 16-bit floats, and
  the only path past 16 rows (float32 too: an IEEE float32 dot).

Split-K reduction in one launch (the CUDA samples' ``threadFenceReduction``: the last block reduces): each
split writes its float32 partial tile to a workspace, then takes a ticket from a per-tile counter; the
split that draws the last ticket sums the partials in split order (deterministic: the result does not
depend on which split finished first), adds the bias, writes y and resets the counter to 0 for the next
launch. No memset, no second kernel, no host sync and no data-dependent allocation: CUDA-graph safe. The
counters are one persistent int32 buffer per device (:func:`prepare`), so launches of this kernel on one
device must not run concurrently on different streams.

SwiGLU prologue (``act="silu_mul"``, for an MLP's down projection): x is the gate/up projection's output
(M, 2K) = ``[gate | up]`` and the GEMV computes ``silu(gate) * up @ weight.T``: each x tile is made from the
gate tile at column k and the up tile at k + K by ``triton_fused_ops._silu_mul``, the function the
``silu_and_mul`` kernel uses, rounded to x's dtype as it rounds, so the fused GEMV multiplies bitwise the
same x as ``gemv(silu_and_mul(x), weight)`` and (same config) returns the same bits, with one launch and no
(M, K) intermediate instead of two. To keep the silu's bits this variant is compiled, like
``silu_and_mul``, without FP contraction, and its FMA path calls ``tl.fma`` where the plain GEMV's
``acc += x * w`` is contracted to an FMA by the compiler; nothing else in the kernel multiplies and adds.

Under the Triton interpreter (``TRITON_INTERPRET=1``: CPU tensors, for tests) the kernel runs as is;
``round_rne`` does the float32 -> bfloat16 rounding the interpreter's cast does not do, and ``tl.dot`` gets
float32 operands (the interpreter's dot multiplies 16-bit floats' bit patterns as integers).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from attnserve.kernels import pdl
from attnserve.kernels.triton_common import INTERPRETED, LAUNCH_OPTIONS, TICKETS, pdl_wait, round_rne, ticket_counters
from attnserve.kernels.triton_fused_ops import silu_mul
from attnserve.kernels.triton_gemv_config import (  # noqa: F401 (MAX_FMA_M ...: the kernel's public names)
    ACTS,
    MAX_FMA_M,
    MAX_M,
    PROLOGUE_X_PER_THREAD,
    SMEM_BUDGET,
    GemvConfig,
    check_config,
    default_config,
    fit_config,
)


def prepare(device: torch.device | str) -> torch.Tensor:
    """The split-K counters of ``device`` (``triton_common.ticket_counters``). Call before capturing a CUDA graph."""
    return ticket_counters("triton_gemv", device)


@triton.jit
def gemv_step(
    acc,
    w_ptrs,
    x_ptrs,
    k,
    K,
    k_offs,
    MASKED: tl.constexpr,
    DOT: tl.constexpr,
    PRECISION: tl.constexpr,
    ACT: tl.constexpr,
    NO_CONTRACT: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """One BLOCK_K step at column ``k``: the weight tile times every row of x, added to ``acc``. With
    ``ACT == "silu_mul"`` the x tile is ``silu(gate) * up`` of the gate at ``x_ptrs`` and the up K columns on."""
    if MASKED:
        w = tl.load(w_ptrs + k, mask=k + k_offs < K, other=0.0)
    else:
        w = tl.load(w_ptrs + k)
    return gemv_tile(acc, w, x_ptrs, k, K, k_offs, MASKED, DOT, PRECISION, ACT, NO_CONTRACT, INTERPRET)


@triton.jit
def gemv_tile(
    acc,
    w,
    x_ptrs,
    k,
    K,
    k_offs,
    MASKED: tl.constexpr,
    DOT: tl.constexpr,
    PRECISION: tl.constexpr,
    ACT: tl.constexpr,
    NO_CONTRACT: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """:func:`gemv_step` with the weight tile ``w`` at column ``k`` already loaded. ``NO_CONTRACT``: the
    kernel is compiled without FP contraction (a SwiGLU in it), so the FMA path writes out the FMA that the
    plain GEMV's compiler makes of ``acc += x * w`` (the same bits either way)."""
    if MASKED:
        x = tl.load(x_ptrs + k, mask=k + k_offs < K, other=0.0)
    else:
        x = tl.load(x_ptrs + k)
    if ACT == "silu_mul":  # masked columns: silu(0) * 0 = 0, times a 0 weight
        if MASKED:
            up = tl.load(x_ptrs + K + k, mask=k + k_offs < K, other=0.0)
        else:
            up = tl.load(x_ptrs + K + k)
        x = silu_mul(x.to(tl.float32), up.to(tl.float32), x.dtype, INTERPRET)  # silu_and_mul's bits
    if DOT:
        if INTERPRET:  # the interpreter's dot multiplies 16-bit floats' bits as integers
            acc = tl.dot(w.to(tl.float32), tl.trans(x.to(tl.float32)), acc, input_precision="ieee")
        else:
            acc = tl.dot(w, tl.trans(x), acc, input_precision=PRECISION)
    else:
        if NO_CONTRACT:
            if INTERPRET:  # the interpreter rounds the product and the sum, as the plain path's line below
                acc += x.to(tl.float32) * w.to(tl.float32)
            else:  # compiled without contraction: the FMA that the plain GEMV's compiler makes of that line
                acc = tl.fma(x.to(tl.float32), w.to(tl.float32), acc)
        else:
            acc += x.to(tl.float32) * w.to(tl.float32)  # (BLOCK_M, 1, BK) * (1, BLOCK_N, BK): K reduced at the end
    return acc


# one compiled kernel for every split count, and for every row count of a BLOCK_M: Triton would otherwise
# compile M % 16 == 0 (a bucket: 16, 32, 48, 64) apart from the row counts between buckets (the LM head's
# exact request count, short eager steps), at their first call, mid-serving
@triton.jit(do_not_specialize=["M", "splits"])
def _gemv_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    part_ptr,
    count_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_ym,
    k_per_split,
    splits,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT: tl.constexpr,
    DOT: tl.constexpr,
    PRECISION: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr,
    ACT: tl.constexpr,
    OUT_ACT: tl.constexpr,
    NO_CONTRACT: tl.constexpr,
    INTERPRET: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """Program (n tile, k split): ``y[:, tile] (+)= x[:, split] @ w[tile, split].T``. The split count is
    a runtime argument; SPLIT says whether there are several. ``ACT``: x's prologue (``ACTS``). ``OUT_ACT``:
    the epilogue; with ``"silu_mul"`` the weight is ``[gate; up]`` (2N, K), a tile's first BLOCK_N / 2 rows
    are gate rows and the rest the up rows N further (one MMA operand), and y is ``silu(gate) * up``
    (N wide, BLOCK_N / 2 columns a program). ``USE_PDL``:
    launched with programmatic dependent launch (``kernels/pdl.py``): with ``EVEN_K`` each program loads its
    first weight tile before the wait, into registers (the same products in the same order: the same bits)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    if OUT_ACT == "silu_mul":  # tile row r: gate row (r < BLOCK_N / 2) or up row of output column offs_n[r]
        HALF: tl.constexpr = BLOCK_N // 2
        r = tl.arange(0, BLOCK_N)
        offs_n = pid_n * HALF + r % HALF
        rows_n = tl.minimum(offs_n, N - 1).to(tl.int64) + (r // HALF) * N
    else:
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rows_n = tl.minimum(offs_n, N - 1).to(tl.int64)
    # rows past M / N are clamped to the last one, not masked: the loads stay unpredicated 16-byte vectors;
    # those rows are computed and never stored
    rows_m = tl.minimum(offs_m, M - 1)
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    # whole BLOCK_K steps unmasked; the one split that holds K's ragged end adds a masked step
    k_main = tl.minimum(k_hi, K - K % BLOCK_K)
    if DOT:
        k_offs = offs_k[None, :]
        w_ptrs = w_ptr + rows_n[:, None] * stride_wn + k_offs  # (BLOCK_N, BLOCK_K)
        x_ptrs = x_ptr + rows_m[:, None] * stride_xm + k_offs  # (BLOCK_M, BLOCK_K)
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)  # transposed: weight rows are the MMA's M
    else:
        k_offs = offs_k[None, None, :]
        w_ptrs = w_ptr + rows_n[None, :, None] * stride_wn + k_offs  # (1, BLOCK_N, BLOCK_K)
        x_ptrs = x_ptr + rows_m[:, None, None] * stride_xm + k_offs  # (BLOCK_M, 1, BLOCK_K)
        acc = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), dtype=tl.float32)
    if USE_PDL and EVEN_K:
        # the split's first weight tile is loaded while the kernel before this one still runs (a weight is
        # no kernel's output: step 1 of kernels/pdl.py); with EVEN_K every split has at least one full step
        w_first = tl.load(w_ptrs + k_lo)
        pdl_wait(USE_PDL)
        acc = gemv_tile(acc, w_first, x_ptrs, k_lo, K, k_offs, False, DOT, PRECISION, ACT, NO_CONTRACT, INTERPRET)
        k_lo += BLOCK_K
    else:
        pdl_wait(USE_PDL)
    for k in range(k_lo, k_main, BLOCK_K):
        acc = gemv_step(acc, w_ptrs, x_ptrs, k, K, k_offs, False, DOT, PRECISION, ACT, NO_CONTRACT, INTERPRET)
    if not EVEN_K:
        if k_main < k_hi:
            acc = gemv_step(acc, w_ptrs, x_ptrs, k_main, K, k_offs, True, DOT, PRECISION, ACT, NO_CONTRACT, INTERPRET)
    if DOT:
        acc = tl.trans(acc)  # (BLOCK_M, BLOCK_N)
    else:
        acc = tl.sum(acc, axis=2)  # (BLOCK_M, BLOCK_N): the one cross-lane reduction

    # a split's (M, N) partial; with OUT_ACT (M, tiles * BLOCK_N) in the tiles' row order (pid_n * BLOCK_N + r)
    if OUT_ACT == "silu_mul":
        width = tl.num_programs(0) * BLOCK_N
    else:
        width = N
    tile = offs_m[:, None] * width + (pid_n * BLOCK_N + tl.arange(0, BLOCK_N))[None, :]
    tile_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    last = True  # this program stores y: without split-K each one, else the split that draws the last ticket
    if SPLIT:
        tl.store(part_ptr + pid_k * M * width + tile, acc, mask=tile_mask)
        # every thread's partial is stored before the ticket (a CTA barrier, then the atomic's release at
        # GPU scope); the last split's loads below come after its acquire
        tl.debug_barrier()
        last = tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel", scope="gpu") == splits - 1
        if last:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for s in range(0, splits):  # split order, whoever came last: deterministic
                acc += tl.load(part_ptr + s * M * width + tile, mask=tile_mask, other=0.0, cache_modifier=".cg")
    if last:
        _store_y(
            y_ptr,
            acc,
            b_ptr,
            rows_n,
            offs_m,
            offs_n,
            pid_n,
            M,
            N,
            stride_ym,
            BLOCK_M,
            BLOCK_N,
            HAS_BIAS,
            OUT_ACT,
            INTERPRET,
        )
        if SPLIT:
            tl.atomic_xchg(count_ptr + pid_n, 0)  # ready for the next launch


@triton.jit
def _store_y(
    y_ptr,
    acc,
    b_ptr,
    rows_n,
    offs_m,
    offs_n,
    pid_n,
    M,
    N,
    stride_ym,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    OUT_ACT: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """y's tile from the float32 sums ``acc`` (BLOCK_M, BLOCK_N): plus the bias of each weight row, rounded
    once. With ``OUT_ACT == "silu_mul"`` the tile's gate and up halves, each so rounded (as the plain GEMV's
    (M, 2N) output is), give ``silu(gate) * up`` with ``silu_and_mul``'s bits, BLOCK_N / 2 columns."""
    if HAS_BIAS:
        acc += tl.load(b_ptr + rows_n).to(tl.float32)[None, :]
    y = round_rne(acc, y_ptr.dtype.element_ty, INTERPRET)
    if OUT_ACT == "silu_mul":
        HALF: tl.constexpr = BLOCK_N // 2
        gate, up = tl.split(tl.permute(tl.reshape(y.to(tl.float32), (BLOCK_M, 2, HALF)), (0, 2, 1)))
        y = silu_mul(gate, up, y_ptr.dtype.element_ty, INTERPRET)  # (BLOCK_M, HALF)
        cols = pid_n * HALF + tl.arange(0, HALF)
    else:
        cols = offs_n
    mask = (offs_m[:, None] < M) & (cols[None, :] < N)
    tl.store(y_ptr + offs_m[:, None] * stride_ym + cols[None, :], y, mask=mask)


def gemv(
    x: torch.Tensor,  # (M, K), M <= 64 (MAX_M); float32 / float16 / bfloat16. act="silu_mul": (M, 2K) = [gate | up]
    weight: torch.Tensor,  # (N, K), same dtype, K contiguous
    bias: torch.Tensor | None = None,  # (N,)
    config: GemvConfig | None = None,  # None: default_config(N, K, M, act=act)
    act: str = "none",  # x's prologue: "none", or "silu_mul" (SwiGLU, see the module docstring)
    out_act: str = "none",  # the epilogue: "none", or "silu_mul" (weight (2N, K) = [gate; up], y (M, N))
) -> torch.Tensor:  # (M, N), x's dtype
    """``F.linear(x, weight, bias)`` for a few rows of x, as a Triton GEMV (see the module docstring);
    with ``act="silu_mul"``, ``F.linear(silu_and_mul(x), weight, bias)`` in one launch; with
    ``out_act="silu_mul"``, ``silu_and_mul(F.linear(x, weight, bias))`` in one launch (``config`` as for the
    (2N, K) weight: ``block_n`` weight rows a program, half gate, half up). Raises ValueError for an unknown
    act or out_act, both at once, or an odd row count or block_n below 2 with out_act."""
    if act not in ACTS:
        raise ValueError(f"gemv act must be one of {ACTS}, got {act!r}")
    if out_act not in ACTS:
        raise ValueError(f"gemv out_act must be one of {ACTS}, got {out_act!r}")
    if act != "none" and out_act != "none":
        raise ValueError(f"gemv takes a SwiGLU prologue or epilogue, not both (act={act!r}, out_act={out_act!r})")
    m, k = x.shape[0], weight.shape[1]
    n = weight.shape[0]
    if out_act == "silu_mul" and n % 2:
        raise ValueError(f"gemv out_act='silu_mul' needs a [gate; up] weight of an even row count, got {n}")
    x_cols = 2 * k if act == "silu_mul" else k
    assert x.dim() == 2 and x.shape[1] == x_cols, (tuple(x.shape), tuple(weight.shape), act)
    assert weight.dtype == x.dtype, (weight.dtype, x.dtype)
    assert bias is None or bias.shape == (n,), bias.shape
    if weight.stride(1) != 1:
        raise ValueError("gemv needs the weight's K dimension contiguous (nn.Linear's layout)")
    if x.stride(1) != 1:
        x = x.contiguous()
    out_n = n // 2 if out_act == "silu_mul" else n
    y = torch.empty((m, out_n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return y
    if config is None:
        config = default_config(n, k, m, x.element_size(), act=act)
    check_config(config, m, x.dtype)
    if out_act == "silu_mul" and config.block_n < 2:
        raise ValueError(f"gemv out_act='silu_mul' needs block_n >= 2 (half gate, half up rows), got {config}")
    if k == 0:
        b = bias.expand(m, n) if bias is not None else torch.zeros((m, n), dtype=x.dtype, device=x.device)
        # the SwiGLU of the bias in PyTorch's two ops, whose roundings silu_mul's match: no launch, as without it
        return y.copy_(F.silu(b[:, :out_n]) * b[:, out_n:]) if out_act == "silu_mul" else y.copy_(b)
    if bias is not None and bias.stride(0) != 1:
        bias = bias.contiguous()
    k_per_split = config.k_per_split(k)
    splits = triton.cdiv(k, k_per_split)
    tiles = triton.cdiv(out_n, config.block_n // 2) if out_act == "silu_mul" else triton.cdiv(n, config.block_n)
    if splits > 1:
        assert tiles <= TICKETS, f"{tiles} tiles with split-K: more than {TICKETS} counters"
        part = torch.empty(
            (splits, m, tiles * config.block_n if out_act == "silu_mul" else n), dtype=torch.float32, device=x.device
        )
        counters = prepare(x.device)
    else:
        part = counters = y  # unused pointers
    _gemv_kernel[(tiles, splits)](
        x,
        weight,
        bias if bias is not None else y,
        y,
        part,
        counters,
        m,
        out_n,
        k,
        x.stride(0),
        weight.stride(0),
        y.stride(0),
        k_per_split,
        splits,
        BLOCK_M=config.block_m(m),
        BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        SPLIT=splits > 1,
        DOT=config.dot,
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        HAS_BIAS=bias is not None,
        EVEN_K=k % config.block_k == 0,
        ACT=act,
        OUT_ACT=out_act,
        NO_CONTRACT="silu_mul" in (act, out_act),
        INTERPRET=INTERPRETED,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        **(LAUNCH_OPTIONS if "silu_mul" in (act, out_act) else {}),
        **pdl.launch(x),
    )
    return y
