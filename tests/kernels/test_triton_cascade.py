"""TRITON_ATTN's cascade attention in the Triton interpreter: a decode step whose requests share a prefix of KV
blocks, run as the prefix call (every query token over the prefix, non-causal, 64-row tiles, its splits' partial
results) and the suffix call (decode tiles), which folds those in when unsplit and else writes its own for one
merge, against the float32 oracle over each request's whole table, and against the plain decode call. The GPU run is ``tests/gpu/test_cascade_gpu.py``."""

from __future__ import annotations

import pytest

from tests.helpers import run_cases_in_triton_interpreter

OWN = [0, 3, 15, 16, 40, 7, 1, 22, 9]  # each request's own cached tokens after the prefix (its new one not counted)
CASES = {
    # a 64-token prefix: one KV tile, no split (S = 1: two slots)
    "bf16-short": dict(dtype="bfloat16", hq=8, hkv=2, head=64, prefix_blocks=4, own=OWN),
    # a 256-token prefix: 4 KV tiles, 4 splits in the prefix call, 1 in the suffix call (5 slots)
    "bf16-splits": dict(dtype="bfloat16", hq=8, hkv=2, head=128, prefix_blocks=16, own=OWN),
    "bf16-softcap": dict(dtype="bfloat16", hq=8, hkv=2, head=64, prefix_blocks=16, own=OWN, softcap=5.0),
    "bf16-sinks": dict(dtype="bfloat16", hq=8, hkv=2, head=64, prefix_blocks=16, own=OWN, sinks=True),
    "f32-gqa3": dict(dtype="float32", hq=9, hkv=3, head=64, prefix_blocks=16, own=OWN),
    # 4 requests with up to 200 own tokens: the suffix call splits too (4 + 4 slots, merged by the merge kernel)
    "bf16-split-suffix": dict(dtype="bfloat16", hq=8, hkv=2, head=64, prefix_blocks=16, own=[130, 3, 70, 200]),
}
# [prefix call, suffix call]: each its own count (with 132 SMs; an unsplit suffix call folds the prefix's slots in)
SPLITS = {
    "bf16-short": [1, 1],
    "bf16-splits": [4, 1],
    "bf16-softcap": [4, 1],
    "bf16-sinks": [4, 1],
    "f32-gqa3": [4, 1],
    "bf16-split-suffix": [4, 4],
}
ROWS = {name: [16 if c["dtype"] == "float32" else 64, 16] for name, c in CASES.items()}
TOLERANCE = {"bfloat16": 1.6e-2, "float32": 1e-5}


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    pytest.importorskip("triton")
    return run_cases_in_triton_interpreter("tests.kernels.cascade_interpreted", CASES, tmp_path_factory.mktemp("c"))


@pytest.mark.parametrize("name", list(CASES))
def test_cascade_matches_the_oracle_and_the_plain_call(name, interpreted):
    r = interpreted[name]
    assert (r["splits"], r["rows"]) == (SPLITS[name], ROWS[name])
    scale = r["ref"].abs().max()
    tol = TOLERANCE[CASES[name]["dtype"]]
    assert (r["cascade"] - r["ref"]).abs().max() / scale < tol
    assert (r["cascade"] - r["plain"]).abs().max() / scale < tol
