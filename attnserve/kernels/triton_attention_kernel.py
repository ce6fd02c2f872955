"""The paged-attention kernel in Triton (its launcher: ``triton_attention.paged_attention``): one kernel for mixed
prefill/decode batches, and a split-KV variant.

Design after vLLM's ``triton_unified_attention.py``: a program owns one tile of query rows of one KV head
(``BLOCK_Q`` query tokens x the ``NUM_QPKV`` query heads that share the KV head, padded to ``BLOCK_M``
rows so that ``tl.dot`` gets at least 16 rows even for a single decode token), and walks that request's
KV in tiles of ``BLOCK_N = PAGE * PAGES_PER_TILE`` tokens with an online softmax. A KV tile spans
``PAGES_PER_TILE`` cache pages: the physical block id of each of its tokens comes from the block table in
one vector load (``PAGES_PER_TILE`` distinct addresses, as vLLM's kernel loads ``seq_offset // BLOCK_SIZE``
per token of its ``TILE_SIZE`` tile), and K / V are loaded as ``(HEAD_PAD, BLOCK_N)`` / ``(BLOCK_N,
HEAD_PAD)`` with per-token addresses; each iteration is then one ``(BLOCK_M, HEAD_PAD) @ (HEAD_PAD,
BLOCK_N)`` dot instead of a dot per 16-token page (decode on a GPU is latency-bound at one page per
iteration). ``PAGES_PER_TILE`` is chosen from the page size on the host (``attention_tiles.py``, with the
query tiles); ``PAGES_PER_TILE = 1`` is the first version's page-at-a-time loop (one scalar block-id load per
iteration).

The split-KV variant gives each program a ``1/NUM_SPLITS`` slice of the KV tiles (a whole number of
tiles) and writes a partial output and its log-sum-exp; a second kernel merges the slices
(``triton_merge_splits.py``). That keeps the GPU busy for decode batches too small to fill it.

The KV cache arrives as two views ``(num_blocks, block_size, Hkv, D)`` with any strides, so both the
``(2, N, ...)`` and ``(N, 2, ...)`` cache shapes and the NHD and HND memory orders work unchanged. An fp8
cache is dequantized in registers with per-tensor scales. Attention sinks (gpt-oss: a learned logit per query
head, counted in the softmax's denominator only) start the online softmax of split 0 at ``m = sink, l = 1``
(as vLLM's kernel does), so the merge of the splits' log-sum-exps counts them once. Math is float32; ``input_precision="ieee"``
keeps float32 models exact (Triton's default for float32 dot is TF32).

The kernel's runtime arguments travel as small tuples (records: ``_paged_attention_kernel``'s docstring).
Importing this module imports Triton: only backends import it, lazily.
"""

from __future__ import annotations

import triton
import triton.language as tl

from attnserve.kernels.triton_common import pdl_wait
from attnserve.kernels.triton_fp8_tiles import fp8_operand, fp8_unit
from attnserve.kernels.triton_rope import rope_kv_write_token


@triton.jit
def _paged_attention_kernel(
    out_heads,
    q_heads,
    kc,
    vc,
    bt,
    step,
    parts,
    sinks_ptr,
    scores,
    num_q_heads,
    rope_args,
    NUM_QPKV: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr,
    HEAD: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    PAGE: tl.constexpr,
    PAGES_PER_TILE: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    USE_SOFTCAP: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    KV_FP8: tl.constexpr,
    FP8_DOT: tl.constexpr,
    PREC: tl.constexpr,
    USE_PDL: tl.constexpr,
    ROPE: tl.constexpr,
    HQ: tl.constexpr,
    HQ_PAD: tl.constexpr,
    HK: tl.constexpr,
    HK_PAD: tl.constexpr,
    HALF: tl.constexpr,
    HALF_PAD: tl.constexpr,
    HAS_NORM: tl.constexpr,
    ROUND_Q: tl.constexpr,
    ROUND_K: tl.constexpr,
    INTERPRET: tl.constexpr,
    DECODE: tl.constexpr,
    USE_SINKS: tl.constexpr,
    CAUSAL: tl.constexpr,
    PART_SLOTS: tl.constexpr,
    PART_BASE: tl.constexpr,
    FIRST_STAGE: tl.constexpr,
    FOLD_SLOTS: tl.constexpr = 0,
    ORDERED: tl.constexpr = False,
):
    """Grid (num_query_tiles, Hkv, NUM_SPLITS): one query tile of one KV head, over one split of its KV.
    ``USE_PDL``: launched with programmatic dependent launch (``kernels/pdl.py``); every input may come from
    the kernels before it (the query, the KV just written, the step's metadata), so it waits first.
    ``ROPE`` (decode tiles of one token each, ``NUM_SPLITS == 1``): the program first does the RoPE + KV-write
    kernel's work for its token and KV head (``triton_rope.rope_kv_write_token``: its query heads and
    key head rotated in place, the key and value stored in the cache), then, after a barrier that makes
    those stores visible to the whole program, attends as usual: one kernel instead of two per layer.
    ``DECODE`` (decode tiles of requests 0, 1, ... in order, one query token each): tile i is request i's
    token i, known without loading the tile and query-start arrays, two dependent loads fewer before the
    program's first KV load; with ``ORDERED`` request ``tile_seq[i]`` instead, and the programs of a request's KV
    heads start one after another (the builder can order the requests longest first, ``ORDER_DECODES``: a decode
    step's long contexts then do not run last, alone on a few SMs). ``CAUSAL`` off: every query token sees every
    key below its sequence's length (a cascade's prefix call). ``FIRST_STAGE`` 0: the KV tiles that need no mask run first, in a loop without masks
    (1: every tile masked; ``triton_attention.first_stage`` decides: 1 with a window). ``PART_SLOTS > 0``: the program writes its partial result (output, log-sum-exp) to slot
    ``PART_BASE + split`` of buffers of that many slots per token and head, for a merge after the call.
    ``FOLD_SLOTS > 0`` (one split): ``parts`` holds an earlier call's partial results, that many slots per token and
    head (a cascade's prefix call); the program folds them into its own before it writes the output, so that no
    merge kernel runs after it.

    Records (tuples): ``out_heads``, ``q_heads``: ``(ptr, stride_t, stride_h)``; ``kc``, ``vc``: the key and
    value cache views ``(ptr, stride_b, stride_s, stride_h, fp8 scale)``; ``bt``: ``(block table, row stride)``;
    ``step``: ``(seq_lens, query_start_loc, tile_seq, tile_start)``; ``parts``: the split outputs and
    log-sum-exps (``triton_merge_splits.partial_results``); ``scores``: ``(scale, softcap, window)``;
    ``rope_args`` (ROPE only): ``triton_rope.rope_arguments``' for the step's new tokens."""
    out_ptr, stride_ot, stride_oh = out_heads
    q_ptr, stride_qt, stride_qh = q_heads
    k_ptr, stride_kb, stride_ks, stride_kh, k_scale = kc
    v_ptr, stride_vb, stride_vs, stride_vh, v_scale = vc
    seq_lens_ptr, qsl_ptr, tile_seq_ptr, tile_start_ptr = step
    scale, softcap, window = scores
    BLOCK_N: tl.constexpr = PAGE * PAGES_PER_TILE
    tile = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    pdl_wait(USE_PDL)
    if DECODE:
        if ORDERED:  # programs in tile_seq's order, each request's KV heads one after another
            linear = tile + kvh * tl.num_programs(0)  # the order the GPU starts programs in: x fastest
            kvh = linear % tl.num_programs(1)
            seq_idx = tl.load(tile_seq_ptr + linear // tl.num_programs(1))
        else:
            seq_idx = tile
        q_tile_start = 0
        q_begin = seq_idx
    else:
        seq_idx = tl.load(tile_seq_ptr + tile)
        q_tile_start = tl.load(tile_start_ptr + tile)  # first query token of this tile, relative to its request
        q_begin = tl.load(qsl_ptr + seq_idx)
    if ROPE:
        rope_kv_write_token(
            q_begin.to(tl.int64),
            rope_args,
            kvh,
            kvh + 1,
            True,
            True,
            HQ,
            HQ_PAD,
            HK,
            HK_PAD,
            HALF,
            HALF_PAD,
            HAS_NORM,
            ROUND_Q,
            ROUND_K,
            PAGE,
            KV_FP8,
            INTERPRET,
            True,
        )
        tl.debug_barrier()
    if DECODE:
        q_len = 1
    else:
        q_len = tl.load(qsl_ptr + seq_idx + 1) - q_begin
    seq_len = tl.load(seq_lens_ptr + seq_idx)
    context = seq_len - q_len

    offs_m = tl.arange(0, BLOCK_M)
    q_tok = q_tile_start + offs_m // NUM_QPKV
    head = kvh * NUM_QPKV + offs_m % NUM_QPKV
    row_valid = (offs_m // NUM_QPKV < BLOCK_Q) & (q_tok < q_len)
    q_pos = context + q_tok
    offs_d = tl.arange(0, HEAD_PAD)
    d_mask = offs_d < HEAD
    q = tl.load(
        q_ptr + (q_begin + q_tok)[:, None].to(tl.int64) * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
        mask=row_valid[:, None] & d_mask[None, :],
        other=0.0,
    )
    qk_scale = scale
    if KV_FP8 and FP8_DOT != "scaled":  # the scales leave the loop: into the softmax scale and the output
        qk_scale = scale * (k_scale * fp8_unit(k_ptr.dtype.element_ty, FP8_DOT))
        v_unit = v_scale * fp8_unit(v_ptr.dtype.element_ty, FP8_DOT)
        if FP8_DOT != "cast" and q.dtype != tl.float16:  # float16 holds the fp8 values exactly, bf16 q up to 65504
            q = tl.minimum(tl.maximum(q.to(tl.float32), -65504.0), 65504.0).to(tl.float16)

    # KV tiles this query tile needs: up to the last query's position; with a window, from the first
    # query's window
    if CAUSAL:
        last_pos = tl.minimum(context + q_tile_start + BLOCK_Q, seq_len)  # exclusive
    else:
        last_pos = seq_len
    kv_hi = tl.cdiv(last_pos, BLOCK_N)
    kv_lo = 0
    if USE_WINDOW:
        kv_lo = tl.maximum(context + q_tile_start - window + 1, 0) // BLOCK_N
    if NUM_SPLITS > 1:  # each split owns a whole number of KV tiles; trailing splits may own none
        per_split = tl.cdiv(kv_hi - kv_lo, NUM_SPLITS)
        kv_lo = kv_lo + split * per_split
        kv_hi = tl.minimum(kv_hi, kv_lo + per_split)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    if USE_SINKS:  # split 0 starts from the sink: exp(sink - m) = 1 at m = sink
        with_sink = row_valid & (split == 0)
        sink = tl.load(sinks_ptr + head, mask=with_sink, other=0.0).to(tl.float32)
        m_i = tl.where(with_sink, sink, m_i)
        l_i = tl.where(with_sink, 1.0, l_i)
    acc = tl.zeros([BLOCK_M, HEAD_PAD], tl.float32)
    # online softmax over KV tiles [kv_lo, kv_hi) in two stages: tiles [kv_lo, kv_full) need no mask (every key
    # below seq_len and, causal, at or before the tile's first query; no window), the rest (the diagonal and the
    # ragged last tile) take the masks; keys at positions >= seq_len are neither loaded nor attended
    if FIRST_STAGE == 1:
        kv_full = kv_lo
    elif CAUSAL:
        kv_full = (context + q_tile_start + 1) // BLOCK_N
    else:
        kv_full = seq_len // BLOCK_N
    kv_full = tl.minimum(tl.maximum(kv_full, kv_lo), kv_hi)
    offs_n = tl.arange(0, BLOCK_N)
    bt_row = bt[0] + seq_idx * bt[1]
    for stage in tl.static_range(FIRST_STAGE, 2):
        if stage == 0:
            lo = kv_lo
            hi = kv_full
        else:
            lo = kv_full
            hi = kv_hi
        for j in range(lo, hi):
            k_pos = j * BLOCK_N + offs_n
            n_valid = k_pos < seq_len
            if PAGES_PER_TILE == 1:
                # one page per tile: one block id (a per-token vector load here, as below, is slower; what is slow
                # with small pages is the one-page tile, not this scalar load: docs/benchmarks.md)
                blk = tl.load(bt_row + j).to(tl.int64)
                k_off = blk * stride_kb + offs_n * stride_ks  # (BLOCK_N,)
                v_off = blk * stride_vb + offs_n * stride_vs
            else:
                # each token's physical block: one (BLOCK_N,) load over the tile's PAGES_PER_TILE table
                # entries; tokens past seq_len read no entry (the table may be exactly cdiv(seq_len, PAGE) wide)
                if stage == 0:
                    blk = tl.load(bt_row + k_pos // PAGE).to(tl.int64)  # (BLOCK_N,)
                else:
                    blk = tl.load(bt_row + k_pos // PAGE, mask=n_valid, other=0).to(tl.int64)
                slot = offs_n % PAGE
                k_off = blk * stride_kb + slot * stride_ks
                v_off = blk * stride_vb + slot * stride_vs
            k_mask = d_mask[:, None] if stage == 0 else d_mask[:, None] & n_valid[None, :]
            v_mask = d_mask[None, :] if stage == 0 else n_valid[:, None] & d_mask[None, :]
            k = tl.load(k_ptr + k_off[None, :] + kvh * stride_kh + offs_d[:, None], mask=k_mask, other=0.0)
            v = tl.load(v_ptr + v_off[:, None] + kvh * stride_vh + offs_d[None, :], mask=v_mask, other=0.0)
            # k: (HEAD_PAD, BLOCK_N), v: (BLOCK_N, HEAD_PAD)
            if KV_FP8:
                if FP8_DOT == "scaled":
                    k = (k.to(tl.float32) * k_scale).to(q.dtype)
                    v = (v.to(tl.float32) * v_scale).to(q.dtype)
                else:
                    k = fp8_operand(k, q.dtype, FP8_DOT, False, INTERPRET)
                    v = fp8_operand(v, q.dtype, FP8_DOT, True, INTERPRET)
            s = tl.dot(q, k, input_precision=PREC) * qk_scale  # (BLOCK_M, BLOCK_N) float32
            if USE_SOFTCAP:
                # tanh(x) = 2 sigmoid(2x) - 1, exact enough and available in every Triton version
                s = softcap * (2.0 * tl.sigmoid(2.0 * s / softcap) - 1.0)
            if stage == 1:
                allowed = row_valid[:, None] & n_valid[None, :]
                if CAUSAL:
                    allowed = allowed & (k_pos[None, :] <= q_pos[:, None])
                if USE_WINDOW:
                    allowed = allowed & (k_pos[None, :] > q_pos[:, None] - window)
                s = tl.where(allowed, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            if stage == 0:  # every score is finite here
                m_safe = m_new
            else:
                m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing seen yet stay at 0
            p = tl.exp(s - m_safe[:, None])
            alpha = tl.exp(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
            m_i = m_new
    if KV_FP8 and FP8_DOT != "scaled":
        acc = acc * v_unit
    tok = (q_begin + q_tok).to(tl.int64)
    if FOLD_SLOTS > 0:  # a slot's normalized output o and lse are the state (m, l, acc) = (lse, 1, o)
        fold_row = (tok * num_q_heads + head) * FOLD_SLOTS
        for sl in tl.static_range(FOLD_SLOTS):
            lse_p = tl.load(parts[1] + fold_row + sl, mask=row_valid, other=float("-inf"))
            o_p = tl.load(
                parts[0] + (fold_row + sl)[:, None] * HEAD_PAD + offs_d[None, :], mask=row_valid[:, None], other=0.0
            )
            m_new = tl.maximum(m_i, lse_p)
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp(m_i - m_safe)
            beta = tl.exp(lse_p - m_safe)
            acc = acc * alpha[:, None] + o_p * beta[:, None]
            l_i = l_i * alpha + beta
            m_i = m_new
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None]
    if PART_SLOTS > 0:
        # partials: (T, Hq, PART_SLOTS, HEAD_PAD) and (T, Hq, PART_SLOTS), float32
        row = (tok * num_q_heads + head) * PART_SLOTS + PART_BASE + split
        tl.store(parts[0] + row[:, None] * HEAD_PAD + offs_d[None, :], out, mask=row_valid[:, None])
        lse = tl.where(l_i == 0.0, float("-inf"), m_i + tl.log(l_safe))
        tl.store(parts[1] + row, lse, mask=row_valid)
    else:
        tl.store(
            out_ptr + tok[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=row_valid[:, None] & d_mask[None, :],
        )
