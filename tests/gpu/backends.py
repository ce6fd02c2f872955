"""Which GPU backends (and FlashAttention versions) are installed here, and the cases each one runs."""

from __future__ import annotations

import importlib.util
import os

import torch

from attnserve.attention.backend import KVCacheLayout
from attnserve.config.attention import AttentionConfig
from tests.gpu.cases import Case, standard_cases

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _flashinfer_cases() -> list[Case]:
    # Each new (dtype, head size, layout, kv dtype) compiles FlashInfer kernels on first use (15-100 s):
    # all shapes in bf16 for both head configurations, the other variants on the mixed batch only.
    cases = standard_cases(dtypes=(BF16,), fp8=False, prefill_decode=True)
    g4 = dict(num_heads=32, num_kv_heads=8, head_size=128, block_size=16)
    cases += [
        Case("mixed", dtype=FP16, **g4),
        Case("mixed", layout=KVCacheLayout.HND, **g4),
        Case("decode_b64", kv_cache_dtype="fp8", **g4),
        Case("mixed", kv_cache_dtype="fp8", **g4),
    ]
    return cases


def gpu_targets() -> list[tuple[str, str, AttentionConfig, list[Case]]]:
    """(label, backend enum name, attention config, cases) of every installed GPU backend/version.

    ``ATTNSERVE_GPU_BACKENDS`` (comma-separated labels) narrows the list: TRITON_ATTN, FLEX_ATTENTION,
    FLASH_ATTN/3, FLASH_ATTN/4, FLASH_ATTN/2, FLASHINFER, FLASHINFER/no-prefill.
    """
    targets = []
    if _has("triton"):
        targets.append(
            (
                "TRITON_ATTN",
                "TRITON_ATTN",
                AttentionConfig(),
                standard_cases(
                    dtypes=(BF16, FP16, FP32),
                    fp8=True,
                    prefill_decode=False,  # refused: decodes and prefills always run as separate calls
                    layouts=(KVCacheLayout.NHD, KVCacheLayout.HND),
                ),
            )
        )
    if _has("flash_attn_interface"):
        targets.append(("FLASH_ATTN/3", "FLASH_ATTN", AttentionConfig(flash_attn_version=3), standard_cases(fp8=True)))
    if _has("flash_attn.cute"):
        targets.append(("FLASH_ATTN/4", "FLASH_ATTN", AttentionConfig(flash_attn_version=4), standard_cases()))
    if _has("flash_attn_2_cuda"):  # FA2's compiled extension (flash_attn alone may be FA4's namespace)
        fa2 = [Case(s, block_size=256, dtype=dt) for s in ("decode_b64", "prefill", "mixed") for dt in (BF16, FP16)]
        targets.append(("FLASH_ATTN/2", "FLASH_ATTN", AttentionConfig(flash_attn_version=2), fa2))
    if _has("flashinfer"):
        targets.append(("FLASHINFER", "FLASHINFER", AttentionConfig(), _flashinfer_cases()))
        targets.append(
            ("FLASHINFER/no-prefill", "FLASHINFER", AttentionConfig(disable_flashinfer_prefill=True), [Case("mixed")])
        )
    if _has("triton"):  # last: its first torch.compile is the slowest start
        targets.append(
            ("FLEX_ATTENTION", "FLEX_ATTENTION", AttentionConfig(), standard_cases(dtypes=(BF16, FP16, FP32)))
        )
    wanted = os.environ.get("ATTNSERVE_GPU_BACKENDS")
    if wanted:
        keep = {w.strip() for w in wanted.split(",")}
        targets = [t for t in targets if t[0] in keep]
    return targets
