"""TRITON_ATTN's paged-attention kernel builds for an H100/H200 (sm_90) without a GPU: Triton compiles it
ahead of time to a cubin with its bundled ``ptxas``, and ``cuobjdump -res-usage`` reports the registers,
stack and local memory of the result (``tests/kernels/triton_attention_sm90.py``, in a process of its own
without ``TRITON_INTERPRET``).

The interpreter (``test_triton_attention_vs_reference.py``) runs the kernel's Python; this checks what the
interpreter cannot: that the GPU compiler accepts the KV-tile variants the host picks
(``default_pages_per_tile``) and that they neither spill (no stack, no local memory) nor pass 64 KB of
shared memory (``KV_TILE_BYTES``'s aim: sm_75's per-block limit; fp8 caches: sm_89's 99 KB). Nothing here runs on a GPU, so nothing
here says anything about speed.
"""

from __future__ import annotations


import pytest

from tests.helpers import run_cases_in_subprocess

pytest.importorskip("triton")

# (dtype, head, query heads per KV head, page, num_splits, window, RoPE + KV write inside[, a decode call's tiles
# and launch options[, an fp8 cache]]). Splits only in decode calls, as the builder launches them: with 4 warps and 3 stages
# instead of its 8 and 2, the float32 split variant spills (255 registers + 320 bytes of stack).
VARIANTS = [
    ("bf16", 128, 2, 16, 1, False, True, True),  # Qwen3 batch-64 decode: RoPE, q/k norm and the KV write inside
    ("bf16", 128, 4, 16, 1, False, False),  # Llama-3 8B, 16-token pages: 4 pages per tile
    ("bf16", 128, 2, 16, 16, False, False, True),  # Qwen3, split-KV decode
    ("bf16", 128, 4, 16, 16, False, False, True),  # Llama-3 8B batch 1: split-KV decode, 16-token pages
    ("bf16", 128, 4, 64, 32, False, False, True),  # the same with 64-token pages (one page per tile)
    ("bf16", 128, 4, 32, 1, True, False),  # 2 pages per tile, sliding window
    ("bf16", 128, 4, 64, 1, False, False),  # one page per tile (the scalar block-id path)
    ("bf16", 256, 4, 16, 1, False, False),  # head 256: 32-token tiles
    ("fp32", 128, 4, 16, 4, False, False, True),  # float32 (ieee dot): 32-token tiles, split-KV decode
    ("fp32", 256, 4, 16, 1, False, False),  # float32 head 256: one page per tile
    # fp8 caches, the default path (default_fp8_dot: f16v, 128-token tiles) with the builder's fp8 decode launch
    ("bf16", 128, 4, 16, 1, False, False, True, "fp8e4nv"),  # Llama-3 8B batch-64 decode, e4m3
    ("bf16", 128, 4, 16, 1, False, False, True, "fp8e5"),  # the same, e5m2
    ("bf16", 128, 4, 16, 16, False, False, True, "fp8e4nv"),  # split-KV decode
    ("bf16", 128, 2, 16, 1, False, True, True, "fp8e4nv"),  # Qwen3 decode with RoPE and the fp8 KV write inside
    ("bf16", 128, 4, 16, 1, False, False, False, "fp8e4nv"),  # prefill / mixed tiles
]
# fp8 needs sm_89+ (Triton's e4m3), whose per-block limit is 99 KB (sm_89; sm_90: 227 KB): 128-token fp8 tiles
# stage 72 KB. (float32 queries over an fp8 cache spill, as they did before default_fp8_dot: not listed.)
FP8_SHARED_LIMIT = 99 * 1024


def build_sm90(variants: list[dict], folder) -> list:
    """``tests.kernels.triton_attention_sm90``'s results for ``variants``, built in a process without
    ``TRITON_INTERPRET``; skips the test where Triton's NVIDIA backend lacks ptxas or cuobjdump."""
    from tests.kernels.triton_attention_sm90 import _tool

    if _tool("ptxas") is None or _tool("cuobjdump") is None:
        pytest.skip("needs Triton's NVIDIA backend with ptxas and cuobjdump")
    return run_cases_in_subprocess("tests.kernels.triton_attention_sm90", variants, folder, interpret=False)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> list:
    keys = ("dtype", "head", "qpkv", "page", "num_splits", "window", "rope", "decode", "kv")
    return build_sm90([dict(zip(keys, v)) for v in VARIANTS], tmp_path_factory.mktemp("sm90"))


# the keys-major fp8 decode (triton_fp8_decode.py) as TRITON_ATTN launches it: (head, qpkv, page, splits, kv, pv)
KEYS_MAJOR = [
    (128, 4, 16, 1, "fp8e4nv", "f16"),  # Llama-3 8B batch-64 decode
    (128, 2, 16, 1, "fp8e5", "f16"),  # Qwen3, e5m2
    (128, 4, 16, 8, "fp8e4nv", "f16"),  # split-KV
    (64, 3, 16, 1, "fp8e4nv", "f16v"),  # SmolLM2's head 64, the PTX conversion
    (256, 8, 64, 1, "fp8e4nv", "f16"),  # head 256, 64-token pages
    (128, 12, 16, 1, "fp8e4nv", "f16"),  # 12 query heads per KV head: 16 rows (wgmma in Triton 3.6)
    (256, 16, 16, 1, "fp8e4nv", "f16"),  # the widest it takes: 255 registers, no stack
]


@pytest.fixture(scope="module")
def built_keys_major(tmp_path_factory) -> list:
    keys = ("head", "qpkv", "page", "num_splits", "kv", "pv")
    return build_sm90([dict(zip(keys, v), kernel="keys") for v in KEYS_MAJOR], tmp_path_factory.mktemp("sm90k"))


@pytest.mark.parametrize("index", range(len(KEYS_MAJOR)), ids=["-".join(map(str, v)) for v in KEYS_MAJOR])
def test_keys_major_fp8_decode_builds_for_sm90_without_spills(index, built_keys_major):
    res, shared = built_keys_major[index]
    assert res["REG"] <= 255 and res["STACK"] == 0 and res["LOCAL"] == 0, res
    assert shared <= FP8_SHARED_LIMIT, shared


# prefill tiles of more rows (paged_attention(block_m=...), benchmarks/gpu/bench_triton_prefill.py): Llama-3 8B,
# bf16, head 128, 16-token pages; 128 rows spill with 4 warps (255 registers + 240-296 bytes of stack), not with 8
PREFILL_TILES = [(64, 4, 2), (64, 8, 3), (128, 8, 2)]  # (block_m, warps, stages)


@pytest.fixture(scope="module")
def built_prefill_tiles(tmp_path_factory) -> list:
    variants = [
        dict(dtype="bf16", head=128, qpkv=4, page=16, num_splits=1, block_m=bm, launch=dict(num_warps=w, num_stages=st))
        for bm, w, st in PREFILL_TILES
    ]
    return build_sm90(variants, tmp_path_factory.mktemp("sm90p"))


@pytest.mark.parametrize("index", range(len(PREFILL_TILES)), ids=["-".join(map(str, v)) for v in PREFILL_TILES])
def test_prefill_tiles_of_more_rows_build_for_sm90_without_spills(index, built_prefill_tiles):
    res, shared = built_prefill_tiles[index]
    assert res["REG"] <= 255 and res["STACK"] == 0 and res["LOCAL"] == 0, res
    assert shared <= FP8_SHARED_LIMIT, shared


# TRITON_ATTN's cascade calls (``TritonAttentionImpl._cascade``), Llama-3 8B heads: the prefix call (64-row tiles,
# non-causal, 4 splits) and the decode suffix call, unsplit (a large batch: it folds the prefix's 4 slots into its
# output) or in 4 splits (8 warps, a small batch: 8 slots for a merge); and decode calls in the builder's order
CASCADE_CALLS = {
    "prefix": dict(
        block_m=64, launch=dict(num_warps=4, num_stages=2), pages_per_tile=4, causal=False, part_base=0, part_slots=4
    ),
    "suffix": dict(decode=True, num_splits=1, part_slots=0, fold_slots=4),
    "suffix-split": dict(decode=True, part_base=4),
    # decode calls in the builder's order (``ORDER_DECODES``): Llama-3 8B heads, and Qwen3's with RoPE inside
    "ordered": dict(decode=True, num_splits=1, part_slots=0, ordered=True),
    "ordered-rope": dict(decode=True, num_splits=1, part_slots=0, ordered=True, rope=True, qpkv=2),
}


@pytest.fixture(scope="module")
def built_cascade(tmp_path_factory) -> list:
    common = dict(dtype="bf16", head=128, qpkv=4, page=16, num_splits=4, part_slots=8)
    return build_sm90([{**common, **v} for v in CASCADE_CALLS.values()], tmp_path_factory.mktemp("sm90c"))


@pytest.mark.parametrize("index", range(len(CASCADE_CALLS)), ids=list(CASCADE_CALLS))
def test_cascade_calls_build_for_sm90_without_spills(index, built_cascade):
    res, shared = built_cascade[index]
    assert res["REG"] <= 255 and res["STACK"] == 0 and res["LOCAL"] == 0, res
    assert shared <= FP8_SHARED_LIMIT, shared


@pytest.mark.parametrize("index", range(len(VARIANTS)), ids=["-".join(map(str, v)) for v in VARIANTS])
def test_kernel_builds_for_sm90_without_spills(index, built):
    res, shared = built[index]
    assert res["REG"] <= 255 and res["STACK"] == 0 and res["LOCAL"] == 0, res
    assert shared <= (FP8_SHARED_LIMIT if len(VARIANTS[index]) > 8 else 64 * 1024), shared
