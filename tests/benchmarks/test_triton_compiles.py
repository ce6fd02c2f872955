"""``benchmarks/gpu/triton_compiles.py`` runs an attnserve command with Triton's JIT hooks set and writes its JSON
(on CPU no Triton kernel compiles: the record list is empty, the command's exit code kept)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_runs_the_command_and_writes_the_record(tmp_path):
    pytest.importorskip("triton")
    out = tmp_path / "c.json"
    cmd = ["attnserve", "backends", "--device", "cuda:9.0", "--assume-installed", "--json"]
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu.triton_compiles", "--json", str(out), "--", *cmd],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads(out.read_text())
    assert (record["command"], record["rc"], record["first_step_s"], record["compiles"]) == (cmd, 0, None, [])
