"""The Triton GEMV's launch configurations that ``GemvPlan`` and the benchmarks try, per (N, K, M).

``candidate_configs`` is the handful the start-up plan times (at most 6); ``sweep_configs`` the few dozen a
benchmark sweeps (``benchmarks/gpu/bench_gemv.py``). Both start from ``triton_gemv.default_config`` and vary the
tile (FMA or tensor cores), the K split and the pipeline depth; each is fitted to M rows and to the shared
memory of one SM (``triton_gemv.fit_config``). Tile choices and their measured effect: docs/benchmarks.md and
``docs/results/issue8-h200.md``. Triton is imported when a config is built, not on import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from attnserve.kernels.triton_gemv import GemvConfig

# FMA tiles for one row (block_n, block_k per 2-byte element, num_warps): 32..128 float32 of register tile
# per thread; for M rows block_n shrinks by M's power of two (the tile is M times taller)
_FMA_TILES = [(8, 512, 4), (16, 512, 4), (32, 256, 4), (16, 1024, 8), (32, 512, 8), (64, 256, 8), (32, 512, 4)]
# tensor-core tiles (block_n, block_k per 2-byte element, num_warps, num_stages) up to 16 rows: <= ~125 KB of
# shared memory in flight
_DOT_TILES = [(32, 128, 4, 4), (64, 128, 4, 4), (64, 256, 4, 3), (128, 128, 8, 3), (32, 256, 4, 4), (128, 64, 4, 4)]
# the same for 17..64 rows (x tiles of 32 or 64 rows; stages cut to triton_gemv.SMEM_BUDGET by fit_config):
# the wider weight tiles re-read x (from L2) fewer times, the narrower ones give more programs
_WIDE_DOT_TILES = [
    (32, 128, 4, 4),
    (64, 128, 4, 3),
    (64, 128, 4, 4),
    (128, 128, 8, 3),
    (128, 128, 4, 3),
    (32, 256, 4, 3),
    (64, 256, 4, 2),
    (64, 64, 4, 4),
    (128, 64, 4, 4),
    (256, 64, 8, 3),
]
# the start-up plan's extra tiles for 17..64 rows, after the default and its split halved / doubled
_WIDE_CANDIDATE_TILES = [(32, 128, 4, 4), (128, 128, 8, 3), (64, 256, 4, 2)]
# ... and one without a K split: a split's partial store, fence and ticket cost more than the fuller GPU gains
# when K is 1024 (chosen by ``benchmarks/gpu/bench_gate_up_swiglu.py --sweep-ms 64``; see docs/benchmarks.md)
UNSPLIT_WIDE_TILE = (64, 128, 4, 4)


def _pow2(v: int) -> int:
    return 1 << max(0, (v - 1).bit_length())


# one-step FMA tiles (:func:`whole_k_config`): K up to this many elements in a program's single step, and at
# most this many warps to hold it (x tile <= 32 elements a thread, the SwiGLU prologue's bound)
WHOLE_K_MAX = 16384
WHOLE_K_MAX_WARPS = 16


def whole_k_config(n: int, k: int, m: int) -> GemvConfig | None:
    """The FMA tile whose one K step is the whole (power-of-2 padded) K: no split, no loop; each program
    loads its ``block_n`` weight rows in one go (before the PDL wait where K is a power of 2) and reduces once.
    ``num_warps`` is the smallest of 4..16 that keeps x's tile at <= 32 elements a thread, ``block_n`` the
    largest (<= 16) that keeps the weight tile at <= 64. None past 4 rows' worth of registers (``m`` rows
    times padded K above ``32 * 32 * WHOLE_K_MAX_WARPS`` elements) or K above ``WHOLE_K_MAX``. At one row it beats
    cuBLAS and the same tile with K split in two on Llama-3.1-8B shapes (``benchmarks/gpu/bench_cascade.py``;
    figures in docs/benchmarks.md).
    """
    from attnserve.kernels.triton_gemv import GemvConfig

    bk, rows = _pow2(k), _pow2(m)
    if bk > WHOLE_K_MAX:
        return None
    warps = max(4, rows * bk // (32 * 32))
    if warps > WHOLE_K_MAX_WARPS:
        return None
    bn = max(1, min(16, 64 * 32 * warps // (rows * bk), _pow2(n)))
    return GemvConfig(bn, max(16, bk), 1, num_warps=warps, num_stages=1, dot=False)


def auto_split(n: int, k: int, block_n: int, block_k: int, num_sms: int, m: int = 1) -> int:
    """Splits of K so that about ``4 * num_sms`` programs run, each with at least one full K step and at
    least ``4 * m`` K elements (its float32 partials at most half the weight bytes it reads)."""
    tiles = -(-n // block_n)
    split = 1
    while tiles * split < 4 * num_sms and split < 32 and k // (2 * split) >= max(block_k, 4 * m):
        split *= 2
    return split


def _wide_dot(
    n: int,
    k: int,
    m: int,
    bn: int,
    bk: int,
    warps: int,
    stages: int,
    elem_bytes: int,
    num_sms: int,
    split_factors: tuple[float, ...] = (1,),
) -> list[GemvConfig]:
    """Tensor-core configs of one tile for 17..64 rows: block_k (given per 2-byte element) scaled to the
    dtype and K, the automatic split times each of ``split_factors`` (1..32)."""
    from attnserve.kernels.triton_gemv import GemvConfig

    bk = max(16, min(bk * 2 // elem_bytes, _pow2(k)))
    s = auto_split(n, k, bn, bk, num_sms, m)
    return [
        GemvConfig(bn, bk, max(1, min(32, int(s * f))), num_warps=warps, num_stages=stages, dot=True)
        for f in split_factors
    ]


def sweep_configs(n: int, k: int, m: int, elem_bytes: int = 2, num_sms: int = 132) -> list[GemvConfig]:
    """A few dozen launch configurations for (N, K, M): the default and it with a shallower and a deeper
    pipeline; up to 16 rows, FMA tiles with the automatic split, half and double it, and tensor-core tiles
    (16-bit only) with the automatic split and double it; past 16 rows (tensor cores only, every dtype),
    wide tensor-core tiles with the automatic split, half and double it. Each fitted to M rows
    (``triton_gemv.fit_config``: shared memory)."""
    from attnserve.kernels.triton_gemv import MAX_FMA_M, GemvConfig, default_config, fit_config

    rows = _pow2(m)
    base = default_config(n, k, m, elem_bytes, num_sms)
    out = [base] + [
        GemvConfig(base.block_n, base.block_k, base.split_k, base.num_warps, stages, base.dot)
        for stages in ((1, 3) if not base.dot else (2, 5))
    ]
    if m > MAX_FMA_M:
        for bn, bk, warps, stages in _WIDE_DOT_TILES:
            out += _wide_dot(n, k, m, bn, bk, warps, stages, elem_bytes, num_sms, (0.5, 1, 2))
    else:
        for bn, bk, warps in _FMA_TILES:
            bn = max(1, bn // rows)
            bk = min(bk * 2 // elem_bytes, _pow2(k))
            s = auto_split(n, k, bn, bk, num_sms)
            for split in {max(1, s // 2), s, min(32, 2 * s)}:
                out.append(GemvConfig(bn, max(16, bk), split, num_warps=warps, num_stages=2))
        if elem_bytes == 2:
            for bn, bk, warps, stages in _DOT_TILES:
                bk = min(bk, _pow2(k))
                s = auto_split(n, k, bn, bk, num_sms)
                for split in {s, min(32, 2 * s)}:
                    out.append(GemvConfig(bn, max(16, bk), split, num_warps=warps, num_stages=stages, dot=True))
    return list(dict.fromkeys(fit_config(c, m, elem_bytes) for c in out))


def candidate_configs(
    n: int, k: int, m: int, elem_bytes: int = 2, num_sms: int = 132, act: str = "none"
) -> list[GemvConfig]:
    """The handful (at most 7) the start-up plan times for ``act`` (``triton_gemv.ACTS``): the default and
    its split halved and doubled; up to 16 rows, two tiles of the other kind (FMA <-> tensor cores) or
    shape, and the one-step tile (:func:`whole_k_config`, where registers allow); past 16 rows four
    tensor-core tiles: narrower (more programs), wider (x re-read fewer times), a longer K step, and one
    without a K split (``UNSPLIT_WIDE_TILE``). Each fitted to M rows and ``act`` (``triton_gemv.fit_config``:
    shared memory, and the SwiGLU prologue's registers)."""
    from attnserve.kernels.triton_gemv import MAX_FMA_M, GemvConfig, default_config, fit_config

    base = default_config(n, k, m, elem_bytes, num_sms)
    out = [
        base,
        GemvConfig(base.block_n, base.block_k, max(1, base.split_k // 2), base.num_warps, base.num_stages, base.dot),
        GemvConfig(base.block_n, base.block_k, min(32, base.split_k * 2), base.num_warps, base.num_stages, base.dot),
    ]
    if m > MAX_FMA_M:
        for bn, bk, warps, stages in _WIDE_CANDIDATE_TILES:
            out += _wide_dot(n, k, m, bn, bk, warps, stages, elem_bytes, num_sms)
        if UNSPLIT_WIDE_TILE is not None:  # (None: not tried; the benchmarks' A/B)
            bn, bk, warps, stages = UNSPLIT_WIDE_TILE
            out.append(GemvConfig(bn, max(16, min(bk * 2 // elem_bytes, _pow2(k))), 1, warps, stages, dot=True))
    else:
        rows = _pow2(m)
        bk = min(512 * 2 // elem_bytes, _pow2(k))
        fma_bn = max(1, 32 // rows)
        out.append(GemvConfig(fma_bn, bk, auto_split(n, k, fma_bn, bk, num_sms), num_warps=8))
        if elem_bytes == 2:
            bk = min(256, _pow2(k))
            out.append(GemvConfig(64, bk, auto_split(n, k, 64, bk, num_sms), num_warps=4, num_stages=3, dot=True))
        whole = whole_k_config(n, k, m)
        if whole is not None:
            out.append(whole)
    return list(dict.fromkeys(fit_config(c, m, elem_bytes, act) for c in out if c.block_k <= max(16, _pow2(k))))
