"""TRITON_ATTN's paged-attention kernel against the plain-PyTorch oracle, on CPU under the Triton interpreter
(``tests/kernels/triton_attention_interpreted.py`` runs the cases in a process of its own).

The kernel walks each request's KV in tiles of ``BLOCK_N = page * pages_per_tile`` tokens (64 by default for
16-bit head <= 128: four 16-token pages, two 32-token pages, one page of 64 or more; 32 for float32 head 128;
128 over an fp8 cache). The cases cover what that tiling touches:
context lengths either side of the tile and page sizes (1, 15, 16, 17, 63, 64, 65, 200), pages of 16 to 128
tokens, 1 to 8 query heads per KV head, split-KV on and off (each split owns whole tiles; some own none),
sliding window, soft cap, fp8 KV (e4m3 and e5m2) with scales and every ``FP8_DOT_MODES`` path, prefill and
mixed batches, tiles of 1 to 8 pages, shuffled block tables whose unused entries point outside the cache; and TRITON_ATTN steps through its builder and impl
on the named shapes of ``tests/gpu/cases.py``. Errors are judged with that file's tolerances
(``TOLERANCE``: max |out - ref| / max |ref| per dtype).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from attnserve.kernels.attention_tiles import FP8_DOT_MODES
from tests.gpu.cases import TOLERANCE
from tests.helpers import run_cases_in_triton_interpreter

DECODE = [(s - 1, 1) for s in (1, 15, 16, 17, 63, 64, 65, 200)]  # (context, query) -> seq lens 1..200
# decodes and prefill chunks with and without context, query lengths around BLOCK_Q
MIXED = [(0, 1), (0, 17), (40, 33), (130, 1), (5, 70), (199, 1), (63, 2)]
# with 64-row tiles: chunks whose first KV tiles lie wholly before their first query (the unmasked loop)
MIXED_LONG = MIXED + [(150, 90), (257, 40), (64, 64), (62, 70)]
LONG = [(999, 1), (776, 1), (0, 1)]  # 16 tiles of 64 at most: up to one tile per split with 16 splits
PROCESSES = 2


def _op(reqs, page, qpkv, dtype, num_splits=1, head=64, num_kv_heads=2, **kw) -> dict:
    return dict(
        reqs=reqs,
        page=page,
        num_heads=qpkv * num_kv_heads,
        num_kv_heads=num_kv_heads,
        head=head,
        dtype=dtype,
        num_splits=num_splits,
        **kw,
    )


def _op_cases() -> dict[str, dict]:
    cases = {}
    for dtype in ("float32", "bfloat16"):
        for page in (16, 32, 64, 128):
            for qpkv in (1, 2, 4, 8):
                for splits in (1, 4):
                    cases[f"decode-bs{page}-gqa{qpkv}-s{splits}-{dtype}"] = _op(DECODE, page, qpkv, dtype, splits)
        for page in (16, 32, 64):
            for splits in (1, 4):
                cases[f"decode-bs{page}-gqa4-s{splits}-sw40-{dtype}"] = _op(DECODE, page, 4, dtype, splits, window=40)
            for qpkv in (1, 3, 8):
                cases[f"mixed-bs{page}-gqa{qpkv}-{dtype}"] = _op(MIXED, page, qpkv, dtype)
            cases[f"mixed-bs{page}-gqa4-sw40-{dtype}"] = _op(MIXED, page, 4, dtype, window=40)
            # the engine's bf16 prefill tiles: 64 rows, unmasked KV tiles first (not windowed); float32's
            # tolerance sees one key too many (bf16's does not)
            for qpkv in (1, 3, 8) if dtype == "bfloat16" else (1, 3):
                cases[f"mixed-bs{page}-gqa{qpkv}-m64-{dtype}"] = _op(MIXED_LONG, page, qpkv, dtype, block_m=64)
            if dtype == "bfloat16":
                cases[f"mixed-bs{page}-gqa4-sw40-m64-{dtype}"] = _op(MIXED_LONG, page, 4, dtype, window=40, block_m=64)
        for splits in (1, 4):
            cases[f"decode-bs16-gqa4-s{splits}-softcap-{dtype}"] = _op(DECODE, 16, 4, dtype, splits, softcap=30.0)
        for qpkv in (4, 8):  # Llama (32 / 8) and Qwen3 (16 / 8) heads per KV head, head size 128
            for splits in (1, 4):
                cases[f"decode-bs16-gqa{qpkv}-s{splits}-d128-{dtype}"] = _op(DECODE, 16, qpkv, dtype, splits, head=128)
        for splits in (1, 3, 16):  # 3 rounds up to 4
            cases[f"long-bs16-gqa4-s{splits}-{dtype}"] = _op(LONG, 16, 4, dtype, splits)
        cases[f"long-bs32-gqa4-s16-sw300-{dtype}"] = _op(LONG, 32, 4, dtype, 16, window=300)
    for page, ppts in ((16, (1, 2, 8)), (32, (1, 4)), (64, (2,))):  # tiles of 16 to 128 tokens
        for ppt in ppts:
            for splits in (1, 4):
                cases[f"decode-bs{page}-ppt{ppt}-gqa4-s{splits}-float32"] = _op(
                    DECODE, page, 4, "float32", splits, pages_per_tile=ppt
                )
            cases[f"mixed-bs{page}-ppt{ppt}-gqa4-sw40-float32"] = _op(
                MIXED, page, 4, "float32", window=40, pages_per_tile=ppt
            )
    for page in (16, 64):
        for splits in (1, 4):
            cases[f"decode-bs{page}-gqa4-s{splits}-kvfp8-bfloat16"] = _op(
                DECODE, page, 4, "bfloat16", splits, kv_fp8=True
            )
        cases[f"mixed-bs{page}-gqa4-kvfp8-float32"] = _op(MIXED, page, 4, "float32", kv_fp8=True)
        # the engine's prefill tiles over an fp8 cache: 64 rows, unmasked KV tiles first
        cases[f"mixed-bs{page}-gqa4-kvfp8-m64-bfloat16"] = _op(MIXED_LONG, page, 4, "bfloat16", kv_fp8=True, block_m=64)
    for mode in FP8_DOT_MODES:  # every way of feeding fp8 tiles to the dots, e4m3 and e5m2
        for kv in ("e4m3", "e5m2"):
            cases[f"decode-bs16-gqa4-s4-d128-kv{kv}-{mode}-bfloat16"] = _op(
                DECODE, 16, 4, "bfloat16", 4, head=128, kv_fp8="e5m2" if kv == "e5m2" else True, fp8_dot=mode
            )
        cases[f"mixed-bs32-gqa4-kve4m3-{mode}-bfloat16"] = _op(MIXED, 32, 4, "bfloat16", kv_fp8=True, fp8_dot=mode)
    cases["decode-bs16-gqa4-s1-kve5m2-float16"] = _op(DECODE, 16, 4, "float16", 1, kv_fp8="e5m2")
    cases["decode-bs16-gqa4-s4-d96-float32"] = _op(DECODE, 16, 4, "float32", 4, head=96)  # HEAD_PAD 128
    cases["decode-bs16-gqa4-s4-float16"] = _op(DECODE, 16, 4, "float16", 4)
    # decode programs in the builder's order (longest first, a request's KV heads together), split and not
    cases["decode-bs16-gqa4-ordered-bfloat16"] = _op(DECODE, 16, 4, "bfloat16", ordered=True)
    cases["decode-bs16-gqa4-s4-ordered-float32"] = _op(DECODE, 16, 4, "float32", 4, ordered=True)
    cases["mixed-bs32-gqa4-s2-float32"] = _op(MIXED[2:4], 32, 4, "float32", 2)  # split-KV over prefill tiles too
    return cases


def _backend_cases() -> dict[str, dict]:
    """TRITON_ATTN steps (``tests.gpu.cases.run_case``): the named shapes, short (``small``) and one 8k decode
    with the split count a 132-SM GPU gets (16) and with none."""
    configs = [
        dict(num_heads=8, num_kv_heads=2, head_size=64, block_size=16),
        dict(num_heads=16, num_kv_heads=2, head_size=64, block_size=64),
    ]
    cases = {}
    for c in configs:
        for dtype in ("float32", "bfloat16"):
            for shape in ("decode_b64", "prefill", "mixed"):
                cases[f"backend-{shape}-bs{c['block_size']}-{dtype}"] = dict(shape=shape, dtype=dtype, **c)
        cases[f"backend-mixed-bs{c['block_size']}-sw40-bfloat16"] = dict(
            shape="mixed", dtype="bfloat16", sliding_window=40, **c
        )
        cases[f"backend-mixed-bs{c['block_size']}-kvfp8-bfloat16"] = dict(
            shape="mixed", dtype="bfloat16", kv_cache_dtype="fp8", **c
        )
        cases[f"backend-mixed-bs{c['block_size']}-HND-float32"] = dict(
            shape="mixed", dtype="float32", layout="HND", **c
        )
    llama = dict(
        shape="decode_b1_ctx8k",
        num_heads=32,
        num_kv_heads=8,
        head_size=128,
        block_size=16,
        dtype="bfloat16",
        small=False,
    )
    cases["backend-decode_b1_ctx8k-llama-split"] = dict(builder_attrs={"num_sms": 132}, **llama)
    cases["backend-decode_b1_ctx8k-llama"] = dict(llama)
    return cases


OP_CASES = _op_cases()
BACKEND_CASES = _backend_cases()


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    """Every case's result, from ``PROCESSES`` interpreter processes run side by side (minutes of CPU)."""
    pytest.importorskip("triton")
    names = [("op", n) for n in OP_CASES] + [("backend", n) for n in BACKEND_CASES]
    cases = {"op": OP_CASES, "backend": BACKEND_CASES}
    shares = [{"op": {}, "backend": {}} for _ in range(PROCESSES)]
    for i, (kind, name) in enumerate(names):
        shares[i % PROCESSES][kind][name] = cases[kind][name]
    with ThreadPoolExecutor(PROCESSES) as pool:
        parts = pool.map(
            lambda share: run_cases_in_triton_interpreter(
                "tests.kernels.triton_attention_interpreted", share, tmp_path_factory.mktemp("triton_attention")
            ),
            shares,
        )
        results = {}
        for part in parts:
            results.update(part)
    return results


def test_default_pages_per_tile():
    """Tiles of 64 tokens for 16-bit (and fp8) head <= 128, whatever the page; one page per tile from pages
    of 64; 32 tokens where a 64-token K tile would pass 16 KiB (float32, head 256). Plain Python: runs without
    Triton."""
    from attnserve.kernels.attention_tiles import default_pages_per_tile

    for head_pad, elem in ((128, 2), (64, 2), (128, 1), (64, 4)):
        assert [default_pages_per_tile(p, head_pad, elem) for p in (16, 32, 64, 128, 256)] == [4, 2, 1, 1, 1]
    for head_pad, elem in ((128, 4), (256, 2)):
        assert [default_pages_per_tile(p, head_pad, elem) for p in (16, 32, 64)] == [2, 1, 1]
    assert [default_pages_per_tile(p, 256, 4) for p in (16, 32)] == [1, 1]
    assert [default_pages_per_tile(16, 64, 2, t) for t in (16, 32, 96, 128)] == [1, 2, 4, 8]
    # an fp8 cache under 16-bit queries: 128-token tiles (16 KiB of fp8 per K tile at head 128); float32
    # queries keep theirs
    assert [default_pages_per_tile(p, 128, 2, kv_elem_bytes=1) for p in (16, 32, 64, 128, 256)] == [8, 4, 2, 1, 1]
    assert [default_pages_per_tile(p, 256, 2, kv_elem_bytes=1) for p in (16, 32, 64)] == [4, 2, 1]
    assert [default_pages_per_tile(p, 128, 4, kv_elem_bytes=1) for p in (16, 32, 64)] == [2, 1, 1]


@pytest.mark.parametrize("name", list(OP_CASES))
def test_paged_attention_matches_reference_in_interpreter(name, interpreted):
    fields = OP_CASES[name]
    out, ref = interpreted[name]["out"], interpreted[name]["ref"]
    assert not torch.isnan(out).any(), "NaN (or a row the kernel did not write)"
    rel = (out.float() - ref).abs().max().item() / max(ref.abs().max().item(), 1e-6)
    tol = TOLERANCE["fp8" if fields.get("kv_fp8") else getattr(torch, fields["dtype"])]
    assert rel <= tol, f"{name}: relative error {rel:.2e} > {tol:.1e}"


@pytest.mark.parametrize("name", list(BACKEND_CASES))
def test_triton_attn_backend_matches_reference_in_interpreter(name, interpreted):
    row = interpreted[name]
    assert row["pass"], row
    if name.endswith("-split"):
        # the split-KV kernel ran, with its maximum split count (8k tokens are 128 KV tiles: more than enough)
        assert row["splits"] == [32], row
    elif "ctx8k" in name:
        assert row["splits"] == [1], row
