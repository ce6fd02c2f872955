"""Paged decode over an fp8 KV cache with the KV tile as the dots' M side ("keys-major"), in Triton.

TRITON_ATTN's unified kernel (``triton_attention_kernel.py``) computes ``S = Q K^T`` with the query heads of a KV
head as the dot's rows: a decode program pads its 2-4 query heads to 16 rows (``mma.sync``'s smallest M),
so most of its score tile and softmax is padding, and its fp8 decode loop stops near 2.9 TB/s of fp8 KV on
an H200. Here both products are transposed: ``S^T = K Q^T`` is ``(BLOCK_N tokens, D) @ (D, QROWS)`` and
``O^T += V^T P^T`` is ``(D, BLOCK_N) @ (BLOCK_N, QROWS)``: the KV tile and the head dimension are the M
sides and the query rows the N side, padded only to 8 (``mma.sync``'s m16n8k16 has n = 8), which halves
the padded score tile. Triton 3.6 lowers both dots to ``mma.sync`` at 8 query rows (``wgmma`` at 16, which
measured no faster). K and V are converted to float16 in registers (``PV_MODES``: where V's conversion
happens); the query is float16 (clamped to +-65504), so the result matches the unified kernel's fp8 path to
float16 rounding. The scales leave the loop: k_scale and log2(e) in the scores' scale (``exp2``), v_scale
on the output.

Measured on an H200 (``benchmarks/gpu/bench_fp8_keys_major.py``, docs/benchmarks.md "FP8 KV cache"): its
timing probes (``PROBE``) show K's half of the loop near 4 TB/s and V's path (the transpose that
``V^T``'s dot needs for 8-bit data) taking the rest.

Its loop as Triton pipelines it (2 or more stages) keeps one shared buffer per operand: tile j+1's copies are
issued at the end of iteration j and waited for at the start of j+1 (sm_90 TTGIR), so a program overlaps no load
with its own math and the other programs of its SM hide the latency. Loading tile j+1 into registers while tile j is
computed instead (226 registers at 4 warps) ran 507 us against 345 on an H200 (docs/benchmarks.md, session 35).

One program per (request, KV head, split); decode only (request i's one query token is token i), no
soft-capping, window or sinks: TRITON_ATTN runs ``paged_attention`` for those (``triton_attn.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from attnserve.kernels.triton_common import INTERPRETED, LAUNCH_OPTIONS
from attnserve.kernels.triton_fp8_tiles import fp8_operand
from attnserve.kernels.triton_merge_splits import merge_splits, partial_results

_LOG2E = tl.constexpr(1.4426950408889634)
# "f16": Triton's own conversion of V, after it moves the tile to the dot's layout (the default: 343-346 us
# against 361-363 in three H200 runs, docs/benchmarks.md); "f16v": converted in its load layout (PTX that Triton
# leaves in place, as the unified kernel's "f16v")
PV_MODES = ("f16", "f16v")
# "no_softmax", "no_pv": timing probes that leave part of the loop out (their outputs are wrong)
PROBES = ("", "no_softmax", "no_pv")
# the H200 sweep's best (benchmarks/gpu/bench_fp8_keys_major.py): 64-token tiles, 4 warps, 2 stages
BLOCK_N = 64
LAUNCH = {"num_warps": 4, "num_stages": 2}


def supports(head_size: int, num_queries_per_kv: int) -> bool:
    """Whether :func:`fp8_decode_attention` runs this layer shape: head size a power of two in [16, 256], at
    most 16 query heads per KV head (the query must also be 16-bit)."""
    pow2 = head_size & (head_size - 1) == 0
    return pow2 and 16 <= head_size <= 256 and num_queries_per_kv <= 16


def query_rows(num_queries_per_kv: int) -> int:
    """The dots' N: the query heads of a KV head, padded to a power of two, at least 8 (mma's n8)."""
    return max(8, triton.next_power_of_2(num_queries_per_kv))


@triton.jit
def _softmax_pv(s_t, valid, vt, m_i, l_i, acc, qk_scale):
    """One KV tile's online-softmax update: scores ``s_t`` (BLOCK_N, QROWS) of the tokens ``valid`` marks, V^T
    ``vt`` (HEAD, BLOCK_N) float16; returns the new (m_i, l_i, acc), log2 units."""
    s_t = tl.where(valid[:, None], s_t * qk_scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s_t, 0))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # columns with nothing seen yet stay at 0
    p_t = tl.exp2(s_t - m_safe[None, :])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p_t, 0)
    acc = acc * alpha[None, :] + tl.dot(vt, p_t.to(tl.float16))
    return m_new, l_i, acc


@triton.jit
def _fp8_decode_kernel(
    out_ptr,
    q_ptr,
    k_ptr,
    v_ptr,
    bt_ptr,
    seq_lens_ptr,
    part_out,
    part_lse,
    strides_o,
    strides_q,
    strides_k,
    strides_v,
    bt_stride,
    scales,
    num_q_heads,
    NUM_QPKV: tl.constexpr,
    QROWS: tl.constexpr,
    HEAD: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    PV: tl.constexpr,
    PROBE: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """Grid (batch, Hkv, NUM_SPLITS). ``strides_o``, ``strides_q``: (token, head); ``strides_k``, ``strides_v``:
    (block, slot, head) element strides; ``scales``: (softmax scale, k_scale, v_scale)."""
    stride_ot, stride_oh = strides_o
    stride_qt, stride_qh = strides_q
    stride_kb, stride_ks, stride_kh = strides_k
    stride_vb, stride_vs, stride_vh = strides_v
    scale, k_scale, v_scale = scales
    seq = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)

    offs_r = tl.arange(0, QROWS)
    head = kvh * NUM_QPKV + offs_r
    r_valid = offs_r < NUM_QPKV
    offs_d = tl.arange(0, HEAD)
    q = tl.load(
        q_ptr + seq.to(tl.int64) * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
        mask=r_valid[:, None],
        other=0.0,
    ).to(tl.float32)
    qt = tl.trans(tl.minimum(tl.maximum(q, -65504.0), 65504.0).to(tl.float16))  # (HEAD, QROWS)
    qk_scale = scale * k_scale * _LOG2E

    kv_hi = tl.cdiv(seq_len, BLOCK_N)
    kv_lo = 0
    if NUM_SPLITS > 1:  # each split owns a whole number of KV tiles; trailing splits may own none
        per_split = tl.cdiv(kv_hi, NUM_SPLITS)
        kv_lo = split * per_split
        kv_hi = tl.minimum(kv_hi, kv_lo + per_split)

    m_i = tl.full([QROWS], float("-inf"), tl.float32)  # log2 units
    l_i = tl.zeros([QROWS], tl.float32)
    acc = tl.zeros([HEAD, QROWS], tl.float32)  # O^T
    offs_n = tl.arange(0, BLOCK_N)
    bt_row = bt_ptr + seq * bt_stride
    for j in range(kv_lo, kv_hi):
        k_pos = j * BLOCK_N + offs_n
        n_valid = k_pos < seq_len
        # each token's physical block; tokens past seq_len read no entry
        blk = tl.load(bt_row + k_pos // PAGE, mask=n_valid, other=0).to(tl.int64)
        slot = k_pos % PAGE
        k_off = blk * stride_kb + slot * stride_ks + kvh * stride_kh
        v_off = blk * stride_vb + slot * stride_vs + kvh * stride_vh
        k = tl.load(k_ptr + k_off[:, None] + offs_d[None, :], mask=n_valid[:, None], other=0.0)  # (BLOCK_N, HEAD)
        s_t = tl.dot(k.to(tl.float16), qt)  # (BLOCK_N, QROWS) float32
        if PROBE != "no_pv":
            vt = tl.load(v_ptr + v_off[None, :] + offs_d[:, None], mask=n_valid[None, :], other=0.0)  # (HEAD, N)
            if PV == "f16v":
                vt = fp8_operand(vt, tl.float16, "f16v", True, INTERPRET)
            else:
                vt = vt.to(tl.float16)
        if PROBE == "no_softmax":
            acc = acc + tl.dot(vt, s_t.to(tl.float16))
        elif PROBE == "no_pv":  # V is not read
            acc = acc + tl.sum(s_t, 0)[None, :]
        else:
            m_i, l_i, acc = _softmax_pv(s_t, n_valid, vt, m_i, l_i, acc, qk_scale)
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc * (v_scale / l_safe)[None, :]  # (HEAD, QROWS)
    tok = seq.to(tl.int64)
    r_mask = r_valid[None, :]
    if NUM_SPLITS > 1:
        # partials: (T, Hq, NUM_SPLITS, HEAD) and (T, Hq, NUM_SPLITS), float32, natural-log lse
        row = (tok * num_q_heads + head) * NUM_SPLITS + split
        tl.store(part_out + row[None, :] * HEAD + offs_d[:, None], out, mask=r_mask)
        lse = tl.where(l_i == 0.0, float("-inf"), (m_i + tl.log2(l_safe)) / _LOG2E)
        tl.store(part_lse + row, lse, mask=r_valid)
    else:
        o_off = tok * stride_ot + head[None, :] * stride_oh + offs_d[:, None]
        tl.store(out_ptr + o_off, out.to(out_ptr.dtype.element_ty), mask=r_mask)


def fp8_decode_attention(
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
    num_splits: int = 1,
    block_n: int = BLOCK_N,
    pv: str = "f16",
    q_rows: int | None = None,
    probe: str = "",
    launch: dict | None = None,
) -> torch.Tensor:
    """Decode attention over an fp8 paged cache (module docstring), written into ``out``.

    ``num_splits`` (rounded up to a power of two) splits each request's KV tiles across programs and merges the partial
    results (``triton_merge_splits``); ``block_n``: tokens per KV tile (a power of two, >= 16); ``q_rows``: the
    dots' N (None: :func:`query_rows`); ``launch``: launch options (None: :data:`LAUNCH`). The layer must pass
    :func:`supports`."""
    batch, num_heads, head = query.shape
    num_kv_heads, page = key_cache.shape[2], key_cache.shape[1]
    num_qpkv = num_heads // num_kv_heads
    assert key_cache.dtype in (torch.float8_e4m3fn, torch.float8_e5m2), key_cache.dtype
    assert supports(head, num_qpkv) and query.dtype != torch.float32, (head, num_qpkv, query.dtype)
    assert key_cache.stride(-1) == 1 and value_cache.stride(-1) == 1 and query.stride(-1) == 1
    assert pv in PV_MODES and probe in PROBES, (pv, probe)
    if batch == 0:
        return out
    part_out = part_lse = out  # placeholders when not splitting
    if num_splits > 1:
        num_splits = triton.next_power_of_2(num_splits)  # the merge's arange needs a power of two
        part_out, part_lse = partial_results(batch, num_heads, num_splits, head, query.device)
    _fp8_decode_kernel[(batch, num_kv_heads, num_splits)](
        out,
        query,
        key_cache,
        value_cache,
        block_table,
        seq_lens,
        part_out,
        part_lse,
        (out.stride(0), out.stride(1)),
        (query.stride(0), query.stride(1)),
        tuple(key_cache.stride()[:3]),
        tuple(value_cache.stride()[:3]),
        block_table.stride(0),
        (scale, k_scale, v_scale),
        num_heads,
        NUM_QPKV=num_qpkv,
        QROWS=q_rows or query_rows(num_qpkv),
        HEAD=head,
        PAGE=page,
        BLOCK_N=block_n,
        NUM_SPLITS=num_splits,
        PV=pv,
        PROBE=probe,
        INTERPRET=INTERPRETED,
        **LAUNCH_OPTIONS,
        **(LAUNCH if launch is None else launch),
    )
    if num_splits > 1:
        merge_splits(out, part_out, part_lse, (0, batch), head)
    return out
