"""``benchmarks/gpu/bench_fp8_decode.py --tiny`` on CPU under the Triton interpreter: every fp8 path, both
formats and each kind of swept config (tile sizes, warps, a register cap, splits) runs, agrees with the
reference and lands in the JSON, so that the GPU run does not stop for a trivial reason. Timings are
meaningless here."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT


def test_bench_fp8_decode_runs_tiny_in_the_interpreter(tmp_path):
    pytest.importorskip("triton")
    from attnserve.kernels.attention_tiles import FP8_DOT_MODES

    out = tmp_path / "fp8.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu.bench_fp8_decode", "--tiny", "--json", str(out)]
        + ["--sweep-stages", "2", "--sweep-warps", "4", "8", "--budget", "1000"],
        cwd=ROOT,
        env={**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = json.loads(out.read_text())
    rows = res["rows"] + res["sweep"]
    assert [r for r in rows if "error" in r or not r["ok"]] == [], proc.stdout[-4000:]
    assert {r.get("fp8_dot") for r in res["rows"][1:]} == set(FP8_DOT_MODES)
    assert len(res["sweep"]) == 20 and res["sweep_stopped"] is None
    assert set(res["best"]) == {"e4m3", "e5m2"}
    assert set(res["builder"]) == {"bf16", "fp8"}
    assert "best e4m3" in proc.stdout
