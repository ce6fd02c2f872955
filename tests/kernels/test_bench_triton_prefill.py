"""``benchmarks/gpu/bench_triton_prefill.py --tiny`` on CPU under the Triton interpreter: query tiles of 16 to 128
rows (``paged_attention(block_m=...)``) give the 16-row tiles' output on prefill sequences of ragged lengths
at GQA 4 and 2, that output matches the float32 reference, and every row lands in the JSON, so that the GPU
run does not stop for a trivial reason. Timings are meaningless here."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT


def test_bench_triton_prefill_runs_tiny_in_the_interpreter(tmp_path):
    pytest.importorskip("triton")
    out = tmp_path / "prefill.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu.bench_triton_prefill", "--tiny", "--json", str(out)]
        + ["--warps", "4", "--stages", "2", "--budget", "1000"],
        cwd=ROOT,
        env={
            **os.environ,
            "TRITON_INTERPRET": "1",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        },
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = json.loads(out.read_text())
    assert res["stopped"] is None
    assert [(r["case"], r["block_m"]) for r in res["rows"]] == [
        (case, bm) for case in ("tiny-gqa4", "tiny-gqa2") for bm in (16, 32, 64, 128)
    ]
    for r in res["rows"]:
        assert "error" not in r, r
        assert r["max_abs_vs_16"] == 0.0, r  # the same rows' arithmetic in a larger tile
        assert r["ref_rel"] <= 2.5e-2, r  # bf16 (tests/gpu/cases.py's tolerance)
