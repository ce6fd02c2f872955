"""The GEMV's launch configurations (``triton_gemv.gemv``): ``GemvConfig``, the unmeasured default for a shape,
fitting a configuration to a row count, and the checks a launch must pass. The kernel's design (FMA or
tensor-core tiles, split-K, the SwiGLU prologue and epilogue) is ``triton_gemv``'s docstring.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton

MAX_M = 64  # rows of x; the padded rows (to BLOCK_M) are computed on clamped copies and never stored
MAX_FMA_M = 16  # the FMA path's (BLOCK_M, BLOCK_N, BLOCK_K) float32 register tile: dot past this
SMEM_BUDGET = 160 << 10  # bytes of pipelined tiles per program that default_config / the plan stay under
PROLOGUE_X_PER_THREAD = 32  # x elements per thread in the SwiGLU prologue that fit_config keeps to
ACTS = ("none", "silu_mul")  # gemv's x prologue: x as given, or SwiGLU of x = [gate | up]


@dataclass(frozen=True)
class GemvConfig:
    """One launch configuration. ``split_k`` is an upper bound: K is cut in whole ``block_k`` steps, so
    fewer splits run when K is short (:meth:`splits`)."""

    block_n: int  # weight rows per program (power of 2; >= 16 with dot)
    block_k: int  # K elements per loop step (power of 2, >= 16)
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 2
    dot: bool = False

    def block_m(self, m: int) -> int:
        """x rows per tile for ``m`` rows: m's power of two, at least 16 with dot (the MMA's N side)."""
        return max(16, triton.next_power_of_2(m)) if self.dot else triton.next_power_of_2(m)

    def k_per_split(self, k: int) -> int:
        return triton.cdiv(triton.cdiv(k, self.split_k), self.block_k) * self.block_k

    def splits(self, k: int) -> int:
        return triton.cdiv(k, self.k_per_split(k))

    def smem_bytes(self, m: int, elem_bytes: int = 2, act: str = "none") -> int:
        """Shared memory of the pipelined tiles for ``m`` rows, bytes: ``num_stages`` weight and x tiles (two
        x tiles, gate and up, with ``act="silu_mul"``) with dot; 0 for FMA (registers only). An upper bound
        on what Triton allocates for them (on sm_90 it allocates all ``num_stages`` for wgmma tiles, one
        fewer for mma.sync ones)."""
        if not self.dot:
            return 0
        x_tiles = 2 if act == "silu_mul" else 1
        return (self.block_n + x_tiles * self.block_m(m)) * self.block_k * elem_bytes * self.num_stages

    def label(self) -> str:
        return (
            f"{'dot' if self.dot else 'fma'} n{self.block_n} k{self.block_k} s{self.split_k} "
            f"w{self.num_warps} st{self.num_stages}"
        )


def fit_config(cfg: GemvConfig, m: int, elem_bytes: int = 2, act: str = "none") -> GemvConfig:
    """``cfg`` cut to fit ``m`` rows: with ``act="silu_mul"``, block_k halved (not below 16) until the
    prologue's x tile holds at most ``PROLOGUE_X_PER_THREAD`` elements per thread (its gate and up are
    float32 registers: compiled for sm_90, a 64 x 128 x tile on 4 warps, 64 per thread, spills); with dot,
    num_stages lowered (not below 1) until :meth:`GemvConfig.smem_bytes` is within ``SMEM_BUDGET``."""
    bk, stages = cfg.block_k, cfg.num_stages
    if act == "silu_mul":
        while bk > 16 and cfg.block_m(m) * bk > PROLOGUE_X_PER_THREAD * 32 * cfg.num_warps:
            bk //= 2
    smem = lambda st: replace(cfg, block_k=bk, num_stages=st).smem_bytes(m, elem_bytes, act)  # noqa: E731
    while stages > 1 and smem(stages) > SMEM_BUDGET:  # 0 without dot
        stages -= 1
    return replace(cfg, block_k=bk, num_stages=stages)


def default_config(
    n: int, k: int, m: int = 1, elem_bytes: int = 2, num_sms: int = 132, act: str = "none"
) -> GemvConfig:
    """A launch for (N, K, M) without measuring (the benchmark sweep and :class:`GemvPlan` measure).

    FMA for M <= 2 and for float32 up to 16 rows (tensor cores for 16-bit M >= 3, where the FMAs per weight
    byte add up, and for every dtype past ``MAX_FMA_M`` rows). FMA: ~16 KB of weight per program step with
    16-byte loads along K, a register tile of 64 float32 per thread (BLOCK_M * BLOCK_N * BLOCK_K / 128
    threads). Tensor cores: 128 K elements (256 bytes) per step; up to 16 rows a 32-row weight tile (64 from
    N = 8192), 4 stages; 32 and 64 rows a 64-row weight tile (128 from N = 16384: x is re-read from L2 once
    per N tile, M / BLOCK_N of the weight's bytes), 4 / 3 stages (96 KB of shared memory with the 64-row
    tile: two programs per SM; 144-160 KB, one, with the 128-row one). Then K is split until
    ``tiles * splits >= 4 * num_sms`` programs run, each split keeping at least one full step (>= 256 K
    elements with FMA, 128 with dot) and, with dot, at least 4 * M K elements, so that its float32 partials
    (M x BLOCK_N x 4 bytes) are at most half the weight bytes it reads. Last,
    :func:`fit_config` for ``act`` (shared memory; the SwiGLU prologue's registers).
    """
    dot = (m >= 3 and elem_bytes == 2) or m > MAX_FMA_M
    if dot:
        rows = max(16, triton.next_power_of_2(m))
        if rows <= 16:
            block_n, stages = (64 if n >= 8192 else 32), 4
        else:
            block_n, stages = (128 if n >= 16384 else 64), (4 if rows <= 32 else 3)
        block_k, min_step = 256 // elem_bytes, max(128, 4 * m)
    else:
        block_n, block_k, min_step = max(2, 16 // triton.next_power_of_2(m)), 1024 // elem_bytes, 256
        stages = 2
    block_k = min(block_k, max(16, triton.next_power_of_2(k)))
    tiles = triton.cdiv(n, block_n)
    split = 1
    while tiles * split < 4 * num_sms and split < 32 and k // (2 * split) >= min_step:
        split *= 2
    if split > 1:
        per_split = k // split  # >= min_step
        block_k = min(block_k, 1 << (per_split.bit_length() - 1))
    return fit_config(GemvConfig(block_n, block_k, split, num_warps=4, num_stages=stages, dot=dot), m, elem_bytes, act)


def check_config(cfg: GemvConfig, m: int, dtype: torch.dtype) -> None:
    """Raise ValueError for a configuration the kernel cannot run: block sizes not powers of 2, block_k < 16,
    dot with block_n < 16, rows outside 1..MAX_M, or FMA past MAX_FMA_M rows."""
    pow2 = lambda v: v > 0 and v & (v - 1) == 0  # noqa: E731
    if not (pow2(cfg.block_n) and pow2(cfg.block_k) and cfg.block_k >= 16 and cfg.split_k >= 1):
        raise ValueError(f"bad GEMV config {cfg}: block sizes must be powers of 2, block_k >= 16, split_k >= 1")
    if cfg.dot and (cfg.block_n < 16 or dtype not in (torch.float16, torch.bfloat16, torch.float32)):
        raise ValueError(f"bad GEMV config {cfg}: dot needs block_n >= 16")
    if not 1 <= m <= MAX_M:
        raise ValueError(f"gemv takes 1..{MAX_M} rows, got {m}")
    if not cfg.dot and m > MAX_FMA_M:
        raise ValueError(f"bad GEMV config {cfg}: the FMA path takes 1..{MAX_FMA_M} rows, got {m} (use dot=True)")
