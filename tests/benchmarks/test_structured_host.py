"""benchmarks/structured_host.py runs the engine's structured path and reports each host part per step."""

from __future__ import annotations

import json
import sys

import pytest

pytest.importorskip("xgrammar")


def test_structured_host_reports_the_grammar_parts(tmp_path, monkeypatch):
    from benchmarks import structured_host

    out = tmp_path / "r.json"
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "structured_host",
            "--num-requests",
            "4",
            "--input-len",
            "8",
            "--output-len",
            "12",
            "--vocab-size",
            "50000",
            "--json",
            str(out),
        ],
    )
    structured_host.main()
    r = json.loads(out.read_text())
    free, constrained = r["unconstrained"], r["json_schema"]
    assert free["decode_steps"] > 0 and constrained["decode_steps"] > 0 and constrained["tokens_mean"] == 12
    assert free["median_ms"]["accept"] == free["median_ms"]["fill"] == 0
    assert constrained["median_ms"]["accept"] > 0 and constrained["median_ms"]["fill"] > 0
    assert set(structured_host.PARTS) | {"grammar_host"} == set(constrained["median_ms"])


def test_tail_stats_and_gc_pauses():
    import gc

    from benchmarks.structured_host import GcPauses, tail_stats

    assert tail_stats([float(v) for v in range(1, 101)]) == {"mean": 50.5, "p90": 91.0, "p99": 100.0, "max": 100.0}
    assert tail_stats([2.0]) == {"mean": 2.0, "p90": 2.0, "p99": 2.0, "max": 2.0}
    with GcPauses() as pauses:
        gc.collect()
    summary = pauses.summary()
    assert summary["gen2"]["count"] == 1 and summary["gen2"]["max_ms"] == summary["gen2"]["total_ms"] >= 0
    assert pauses._callback not in gc.callbacks
