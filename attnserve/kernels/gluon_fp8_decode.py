"""Paged decode over an fp8 KV cache, keys-major (``triton_fp8_decode.py``'s math), written in Gluon.

The Triton keys-major kernel computes ``S^T = K Q^T`` and ``O^T += V^T P^T`` with the KV tile and the head dimension
as the dots' M sides and the query heads of a KV head (padded to 8) as N. Two things Triton decides for it cost
time: its pipeliner keeps one shared buffer per operand for these gathered (block-table) loads, so a program
overlaps little of its copies with its own math; and ``V^T`` as the dot's A operand needs a transposed load of
8-bit data, which sm_90 has no ``ldmatrix.trans`` for, so V is read from shared memory one byte per instruction.
Gluon (``triton.experimental.gluon``) makes layouts and shared memory explicit, so this kernel:

- fills a ring of ``NUM_STAGES`` shared buffers for K and V tiles with ``cp.async`` through the block table,
  issuing tile j + NUM_STAGES - 1 before computing tile j (the block-table entries one tile further ahead);
- loads K from shared memory straight into the A-operand layout of ``mma.sync`` (K-major 8-bit: ``ldmatrix``),
  converts it to float16 and computes ``S^T`` against the float16 query (clamped to +-65504) as the B operand;
- reads V in its natural layout with 16-byte loads along the head dimension, converts it to float16 in registers
  and stores it to a float16 shared buffer, from which ``V^T`` is loaded as the A operand (16-bit data:
  ``ldmatrix.trans``) of ``O^T += V^T P^T``.

The online softmax is ``triton_fp8_decode._softmax_pv``'s: log2 units (k_scale and log2(e) in the scores' scale,
``exp2``), tokens past ``seq_len`` masked, ``l == 0`` guarded, v_scale on the output. One program per (request,
KV head); decode only (request i's one query token is row i), no splits, soft-capping, window or sinks.

Gluon is imported lazily: :func:`available` says whether this Triton has it, and importing this module never
needs it.
"""

from __future__ import annotations

import os

import torch

try:  # Gluon ships with Triton 3.5+; without it this module still imports and available() is False
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2
    from triton.runtime.jit import constexpr_function
except Exception:  # noqa: BLE001 - no Triton, or a Triton without Gluon
    gluon = gl = async_copy = mma_v2 = constexpr_function = None

# the fastest config measured (issue 26, H100 2026-12-07: 64-token tiles, 4 warps, 2 stages, K width 4; 3 and 4
# stages and 32-token tiles 5% slower): benchmarks/gpu/bench_fp8_gluon.py sweeps these
BLOCK_N = 64
NUM_STAGES = 2
NUM_WARPS = 4
_LOG2E = 1.4426950408889634
# the kernels are plain (never called) functions where Gluon is missing
_jit = gluon.jit if gluon is not None else (lambda fn: fn)


def available() -> bool:
    """Whether ``triton.experimental.gluon`` (with its Ampere ``cp.async`` and ``mma_v2``) imported here."""
    return gluon is not None


ON_ENV = "ATTNSERVE_GLUON_FP8_DECODE"  # "1": TRITON_ATTN's unsplit fp8 decode calls run this kernel; "0": not
DEFAULT_ON = "1"  # ON_ENV's value when unset: 9% faster than the keys-major kernel on an H100 (docs/benchmarks.md)


def enabled() -> bool:
    """Whether TRITON_ATTN runs its unsplit fp8 decode calls with this kernel: :data:`ON_ENV` (else
    :data:`DEFAULT_ON`) is "1", Gluon imported, and the current CUDA GPU has ``cp.async`` and ``mma.sync``
    (compute capability 8.0+). Raises ValueError for an :data:`ON_ENV` other than "0" or "1"."""
    value = os.environ.get(ON_ENV, DEFAULT_ON)
    if value not in ("0", "1"):
        raise ValueError(f"{ON_ENV}={value!r}: expected '0' or '1'")
    return value == "1" and available() and torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 0)


def supports(head_size: int, num_queries_per_kv: int) -> bool:
    """Whether :func:`gluon_fp8_decode_attention` runs this layer shape: head size 64, 128 or 256, at most 8 query
    heads per KV head (the dots' N is 8)."""
    return head_size in (64, 128, 256) and 1 <= num_queries_per_kv <= 8


def query_rows(num_queries_per_kv: int) -> int:
    """The dots' N: 8 (``mma.sync``'s m16n8k16), which every supported query group fits."""
    return 8


def _constexpr_fn(fn):
    return constexpr_function(fn) if gluon is not None else fn


@_constexpr_fn
def _partials_layout(s_layout, num_warps, qrows):
    """The (num_warps, qrows) layout of the per-warp partial maxima as every thread reads them back: all warps'
    rows in each thread's registers, the columns spread over registers and lanes as in ``s_layout`` (the linear
    form of S^T's MMA layout), so that the max over the rows lands in S^T's column layout with no data moved."""

    def col(basis):
        return [0, basis[1]]

    regs = [col(b) for b in s_layout.reg_bases if b[1] != 0]
    regs += [[1 << i, 0] for i in range(num_warps.bit_length() - 1)]
    lanes = [col(b) for b in s_layout.lane_bases]
    warps = [[0, 0] for _ in s_layout.warp_bases]
    return gl.DistributedLinearLayout(regs, lanes, warps, [], [num_warps, qrows])


@_jit
def _allocate_ring(
    dtype: gl.constexpr, BLOCK_N: gl.constexpr, HEAD: gl.constexpr, NUM_STAGES: gl.constexpr, LAYOUT: gl.constexpr
):
    """The KV ring: a tuple of NUM_STAGES (2 to 4) shared buffers of (2 * BLOCK_N, HEAD), one allocation each, so that
    the barrier analysis tells the slots apart."""
    gl.static_assert(2 <= NUM_STAGES and NUM_STAGES <= 4, "NUM_STAGES: 2 to 4")
    a = gl.allocate_shared_memory(dtype, [2 * BLOCK_N, HEAD], LAYOUT)
    b = gl.allocate_shared_memory(dtype, [2 * BLOCK_N, HEAD], LAYOUT)
    if NUM_STAGES == 2:
        ring = (a, b)
    elif NUM_STAGES == 3:
        ring = (a, b, gl.allocate_shared_memory(dtype, [2 * BLOCK_N, HEAD], LAYOUT))
    else:
        c = gl.allocate_shared_memory(dtype, [2 * BLOCK_N, HEAD], LAYOUT)
        ring = (a, b, c, gl.allocate_shared_memory(dtype, [2 * BLOCK_N, HEAD], LAYOUT))
    return ring


@_jit
def _issue_tile(
    ring,
    k_ptr,
    v_ptr,
    bt_row,
    blk,
    tile,
    buf: gl.constexpr,
    seq_len,
    kv_off_k,
    kv_off_v,
    stride_kb,
    stride_ks,
    stride_vb,
    stride_vs,
    PAGE: gl.constexpr,
    BLOCK_N: gl.constexpr,
    HEAD: gl.constexpr,
    COPY: gl.constexpr,
    BLK: gl.constexpr,
):
    """cp.async of KV tile ``tile`` (its tokens' physical blocks ``blk``) into ring slot ``buf``: K in its first
    BLOCK_N rows, V in the next, tokens past ``seq_len`` zero-filled, in one copy op (one shared-memory write for the
    barrier analysis) and one commit group. Returns the block ids of tile + 1, loaded now so that their latency
    hides behind a tile's math."""
    ROWS: gl.constexpr = gl.SliceLayout(1, COPY)
    offs_r = gl.arange(0, 2 * BLOCK_N, layout=ROWS)  # the slot's rows: K's tokens, then V's
    k_pos = tile * BLOCK_N + offs_r % BLOCK_N
    slot = (k_pos % PAGE).to(gl.int64)
    # the block ids of the tile's tokens, (BLOCK_N,), for both halves of the rows (registers only)
    blk64 = gl.convert_layout(gl.reshape(gl.permute(gl.join(blk, blk), [1, 0]), [2 * BLOCK_N]), ROWS).to(gl.int64)
    is_k = offs_r < BLOCK_N
    rows = gl.where(
        is_k,
        k_ptr + (blk64 * stride_kb + slot * stride_ks + kv_off_k),
        v_ptr + (blk64 * stride_vb + slot * stride_vs + kv_off_v),
    )
    offs_d = gl.arange(0, HEAD, layout=gl.SliceLayout(0, COPY))
    ptrs = rows[:, None] + offs_d[None, :]
    mask = (k_pos < seq_len)[:, None]
    async_copy.async_copy_global_to_shared(ring[buf], ptrs, mask)
    async_copy.commit_group()
    offs_n = gl.arange(0, BLOCK_N, layout=BLK)
    n_pos = (tile + 1) * BLOCK_N + offs_n
    return gl.load(bt_row + n_pos // PAGE, mask=n_pos < seq_len, other=0)


@_jit
def _attend_tile(
    ring, red, p_smem, k_ptr, v_ptr, bt_row, blk, j, buf: gl.constexpr, seq_len, kv_off_k, kv_off_v,
    stride_kb, stride_ks, stride_vb, stride_vs, qt, qk_scale, m_i, l_t, acc,
    PAGE: gl.constexpr, BLOCK_N: gl.constexpr, HEAD: gl.constexpr, NUM_STAGES: gl.constexpr, COPY: gl.constexpr,
    MMA_S: gl.constexpr, MMA_O: gl.constexpr, K_OP: gl.constexpr, V_OP: gl.constexpr, P_OP: gl.constexpr,
    V16_SMEM: gl.constexpr, RED: gl.constexpr, V_READ: gl.constexpr, BLK: gl.constexpr,
):  # fmt: skip
    """KV tile ``j`` in ring slot ``buf`` (a constant: ``j % NUM_STAGES``): ``_softmax_pv``'s update of (m_i, l_t,
    acc), issuing tile j + NUM_STAGES - 1 on the way; returns them and the block ids of the tile after that one."""
    QROWS: gl.constexpr = 8
    NW: gl.constexpr = gl.num_warps()
    # tile j has landed (this thread's copies; the barrier makes them every thread's), and every warp is done
    # with tile j - 1, whose slot the issue below refills
    async_copy.wait_group(NUM_STAGES - 2)
    gl.thread_barrier()
    k = ring[buf].slice(0, BLOCK_N).load(K_OP)  # (BLOCK_N, HEAD) fp8, ldmatrix
    v = ring[buf].slice(BLOCK_N, BLOCK_N).load(V_READ)  # 16-byte reads along the head dimension
    # every warp holds its K and V: the slot (2 * BLOCK_N * HEAD bytes) becomes V's float16 copy, which
    # O^T's dot reads transposed (16-bit: ldmatrix.trans)
    gl.thread_barrier()
    v16 = ring[buf]._reinterpret(gl.float16, [BLOCK_N, HEAD], V16_SMEM)
    v16.store(v.to(gl.float16))
    s_t = mma_v2(k.to(gl.float16), qt, gl.zeros([BLOCK_N, QROWS], gl.float32, layout=MMA_S))  # S^T, fp32
    offs_s = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, MMA_S))
    s_t = gl.where(((j * BLOCK_N + offs_s) < seq_len)[:, None], s_t * qk_scale, float("-inf"))
    if RED is None:  # warps share S^T's tokens some other way: the compiler's reduction
        s_max = gl.convert_layout(gl.max(s_t, 0), gl.SliceLayout(0, MMA_O))
    else:  # each warp's maximum, then all of them through shared memory: one barrier
        red.store(gl.max(gl.reshape(s_t, [NW, BLOCK_N // NW, QROWS]), 1))
        gl.thread_barrier()
        s_max = gl.convert_layout(gl.max(red.load(RED), 0), gl.SliceLayout(0, MMA_O), assert_trivial=True)
    # the next tile's copies, now that this slot's last write (V's float16 copy) is behind a barrier
    blk = _issue_tile(
        ring, k_ptr, v_ptr, bt_row, blk, j + NUM_STAGES - 1, (buf + NUM_STAGES - 1) % NUM_STAGES, seq_len,
        kv_off_k, kv_off_v, stride_kb, stride_ks, stride_vb, stride_vs, PAGE, BLOCK_N, HEAD, COPY, BLK,
    )  # fmt: skip
    s_t = gl.convert_layout(s_t, MMA_O)  # trivial where the two MMA layouts are one
    m_new = gl.maximum(m_i, s_max)
    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)  # columns with nothing seen yet stay at 0
    p_t = gl.exp2(s_t - m_safe[None, :])
    alpha = gl.exp2(m_i - m_safe)
    l_t = l_t * alpha[None, :] + p_t
    p_smem.store(p_t.to(gl.float16))
    gl.thread_barrier()
    vt = v16.permute([1, 0]).load(V_OP)  # (HEAD, BLOCK_N)
    acc = mma_v2(vt, p_smem.load(P_OP), acc * alpha[None, :])
    return m_new, l_t, acc, blk


@_jit
def _gluon_fp8_decode_kernel(
    out_ptr,
    q_ptr,
    k_ptr,
    v_ptr,
    bt_ptr,
    seq_lens_ptr,
    stride_ot,
    stride_oh,
    stride_qt,
    stride_qh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    bt_stride,
    scale,
    k_scale,
    v_scale,
    NUM_QPKV: gl.constexpr,
    HEAD: gl.constexpr,
    PAGE: gl.constexpr,
    BLOCK_N: gl.constexpr,
    NUM_STAGES: gl.constexpr,
    K_WIDTH: gl.constexpr,
):
    """Grid (batch, Hkv). Strides in elements: ``stride_o*``, ``stride_q*``: (token, head); ``stride_k*``,
    ``stride_v*``: (block, slot, head)."""
    QROWS: gl.constexpr = 8
    NW: gl.constexpr = gl.num_warps()
    # S^T (BLOCK_N, QROWS): tokens over the warps (as many as its 16-row MMA tiles allow); O^T (HEAD, QROWS): dims
    WM_S: gl.constexpr = NW if BLOCK_N // 16 >= NW else BLOCK_N // 16
    MMA_S: gl.constexpr = gl.NVMMADistributedLayout(
        version=[2, 0], warps_per_cta=[WM_S, NW // WM_S], instr_shape=[16, 8]
    )
    MMA_O: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[NW, 1], instr_shape=[16, 8])
    # K_WIDTH 4: K's fp8 bytes as ldmatrix gives them (4 along the head dimension a thread), the query to match
    K_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA_S, k_width=K_WIDTH)
    Q_OP: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA_S, k_width=K_WIDTH)
    V_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA_O, k_width=2)
    P_OP: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA_O, k_width=2)
    # 16 bytes a thread along the head dimension: the cp.async copies and V's fp8 -> float16 pass
    TPR: gl.constexpr = HEAD // 16  # threads per token row
    V_READ: gl.constexpr = gl.BlockedLayout([1, 16], [32 // TPR, TPR], [NW, 1], [1, 0])
    COPY: gl.constexpr = V_READ  # the copies into a (2 * BLOCK_N, HEAD) slot
    BLK: gl.constexpr = gl.SliceLayout(1, V_READ)  # a tile's block ids, (BLOCK_N,)
    Q_LOAD: gl.constexpr = gl.BlockedLayout([1, 8], [QROWS, 32 // QROWS], [1, NW], [1, 0])
    RING_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD], gl.float8e4nv)
    V16_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD], gl.float16)
    P_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, QROWS], gl.float16)
    FLAT: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])

    seq = gl.program_id(0)
    kvh = gl.program_id(1)
    seq_len = gl.load(seq_lens_ptr + seq)

    # the query rows of this KV head: float16, clamped to +-65504, transposed to (HEAD, QROWS) as the B operand
    offs_qr = gl.arange(0, QROWS, layout=gl.SliceLayout(1, Q_LOAD))
    offs_qd = gl.arange(0, HEAD, layout=gl.SliceLayout(0, Q_LOAD))
    q = gl.load(
        q_ptr + seq.to(gl.int64) * stride_qt + (kvh * NUM_QPKV + offs_qr)[:, None] * stride_qh + offs_qd[None, :],
        mask=(offs_qr < NUM_QPKV)[:, None],
        other=0.0,
    ).to(gl.float32)
    q = gl.minimum(gl.maximum(q, -65504.0), 65504.0).to(gl.float16)
    qt = gl.convert_layout(gl.permute(q, [1, 0]), Q_OP)
    qk_scale = scale * k_scale * 1.4426950408889634

    # the ring: slot s, (2 * BLOCK_N, HEAD), holds a tile's K (its first BLOCK_N rows) and V, then V as float16
    ring = _allocate_ring(k_ptr.dtype.element_ty, BLOCK_N, HEAD, NUM_STAGES, RING_SMEM)
    p_smem = gl.allocate_shared_memory(gl.float16, [BLOCK_N, QROWS], P_SMEM)
    if WM_S == NW:
        RED: gl.constexpr = _partials_layout(gl.to_linear_layout(MMA_S, [BLOCK_N, QROWS]), NW, QROWS)
        red = gl.allocate_shared_memory(gl.float32, [NW, QROWS], FLAT)
    else:
        RED: gl.constexpr = None
        red = p_smem  # unused

    bt_row = bt_ptr + seq.to(gl.int64) * bt_stride
    kv_off_k = kvh.to(gl.int64) * stride_kh
    kv_off_v = kvh.to(gl.int64) * stride_vh
    num_tiles = gl.cdiv(seq_len, BLOCK_N)
    offs_c = gl.arange(0, BLOCK_N, layout=BLK)
    blk = gl.load(bt_row + offs_c // PAGE, mask=offs_c < seq_len, other=0)  # tile 0's physical blocks
    # prologue: tiles 0 .. NUM_STAGES - 2 (a tile past the end copies nothing: all its tokens are masked)
    for s in gl.static_range(NUM_STAGES - 1):
        blk = _issue_tile(
            ring, k_ptr, v_ptr, bt_row, blk, s, s, seq_len, kv_off_k, kv_off_v,
            stride_kb, stride_ks, stride_vb, stride_vs, PAGE, BLOCK_N, HEAD, COPY, BLK,
        )  # fmt: skip

    m_i = gl.full([QROWS], float("-inf"), gl.float32, layout=gl.SliceLayout(0, MMA_O))  # log2 units
    # l's terms, summed over the tokens once after the loop (no cross-warp sum a tile)
    l_t = gl.zeros([BLOCK_N, QROWS], gl.float32, layout=MMA_O)
    acc = gl.zeros([HEAD, QROWS], gl.float32, layout=MMA_O)  # O^T
    # unrolled by the ring's size so that every slot index is a constant
    for j0 in range(0, num_tiles, NUM_STAGES):
        for s in gl.static_range(NUM_STAGES):
            if j0 + s < num_tiles:
                m_i, l_t, acc, blk = _attend_tile(
                    ring, red, p_smem, k_ptr, v_ptr, bt_row, blk, j0 + s, s, seq_len, kv_off_k, kv_off_v,
                    stride_kb, stride_ks, stride_vb, stride_vs, qt, qk_scale, m_i, l_t, acc,
                    PAGE, BLOCK_N, HEAD, NUM_STAGES, COPY, MMA_S, MMA_O, K_OP, V_OP, P_OP, V16_SMEM, RED, V_READ, BLK,
                )  # fmt: skip
    async_copy.wait_group(0)

    l_i = gl.sum(l_t, 0)
    l_safe = gl.where(l_i == 0.0, 1.0, l_i)
    o = acc * (v_scale / l_safe)[None, :]  # (HEAD, QROWS)
    offs_od = gl.arange(0, HEAD, layout=gl.SliceLayout(1, MMA_O))
    offs_or = gl.arange(0, QROWS, layout=gl.SliceLayout(0, MMA_O))
    o_off = seq.to(gl.int64) * stride_ot + (kvh * NUM_QPKV + offs_or)[None, :] * stride_oh + offs_od[:, None]
    gl.store(out_ptr + o_off, o.to(out_ptr.dtype.element_ty), mask=(offs_or < NUM_QPKV)[None, :])


def gluon_fp8_decode_attention(
    out: torch.Tensor,  # (B, Hq, D): request i's one query token is row i
    query: torch.Tensor,  # (B, Hq, D) float16 or bfloat16, last dim contiguous
    key_cache: torch.Tensor,  # (num_blocks, block_size, Hkv, D) fp8 (e4m3 or e5m2), any strides, last dim contiguous
    value_cache: torch.Tensor,  # same
    block_table: torch.Tensor,  # (B, max_blocks) int32
    seq_lens: torch.Tensor,  # (B,) int32, the new token included
    scale: float,
    *,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    block_n: int = BLOCK_N,
    num_stages: int = NUM_STAGES,
    num_warps: int = NUM_WARPS,
    k_width: int = 4,
) -> torch.Tensor:
    """Decode attention over an fp8 paged cache (module docstring), written into ``out``.

    ``block_n``: tokens per KV tile (a power of two >= 16; with ``num_warps * 16`` or more the warps split S^T's
    tokens and its max takes one barrier); ``num_stages``: the ring's slots (2 to 4); ``num_warps``: warps per program;
    ``k_width``: the K and query operands' elements per thread along the head dimension (4: K straight from
    ``ldmatrix``; 2: 16-bit shared loads). Any page size. The layer must pass :func:`supports`."""
    batch, num_heads, head = query.shape
    num_kv_heads, page = key_cache.shape[2], key_cache.shape[1]
    num_qpkv = num_heads // num_kv_heads
    assert key_cache.dtype in (torch.float8_e4m3fn, torch.float8_e5m2), key_cache.dtype
    assert value_cache.dtype == key_cache.dtype, (key_cache.dtype, value_cache.dtype)
    assert supports(head, num_qpkv) and query.dtype in (torch.float16, torch.bfloat16), (head, num_qpkv, query.dtype)
    assert key_cache.stride(-1) == 1 and value_cache.stride(-1) == 1 and query.stride(-1) == 1
    assert block_n >= 16 and block_n & (block_n - 1) == 0 and 2 <= num_stages <= 4, (block_n, num_stages)
    assert k_width in (2, 4), k_width
    if batch == 0:
        return out
    assert available(), "needs triton.experimental.gluon (Triton 3.5+)"
    _gluon_fp8_decode_kernel[(batch, num_kv_heads)](
        out,
        query,
        key_cache,
        value_cache,
        block_table,
        seq_lens,
        out.stride(0),
        out.stride(1),
        query.stride(0),
        query.stride(1),
        *key_cache.stride()[:3],
        *value_cache.stride()[:3],
        block_table.stride(0),
        float(scale),
        float(k_scale),
        float(v_scale),
        NUM_QPKV=num_qpkv,
        HEAD=head,
        PAGE=page,
        BLOCK_N=block_n,
        NUM_STAGES=num_stages,
        K_WIDTH=k_width,
        num_warps=num_warps,
        enable_fp_fusion=False,  # no FMA contraction, as the Triton kernels (triton_common.LAUNCH_OPTIONS)
    )
    return out
