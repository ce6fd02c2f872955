"""GPU tests print one table at the end: backend, version, case, max error, pass (and write JSON)."""

from __future__ import annotations

import json
import os

import pytest

RESULTS: list[dict] = []
GPU_HIDDEN = 256  # tiny models' hidden size on the GPU: head sizes GPU backends take (64 or 128, by architecture)


@pytest.fixture(scope="session")
def gpu_model_dir(tmp_path_factory, default_tokenizer):
    """Factory: architecture name -> folder with a tiny random model of hidden size ``GPU_HIDDEN`` (made once)."""
    from tests.models.tiny import make_tiny_model

    made: dict[str, str] = {}

    def make(arch: str) -> str:
        if arch not in made:
            made[arch] = make_tiny_model(arch, tmp_path_factory.mktemp(f"gpu-{arch}"), default_tokenizer, GPU_HIDDEN)
        return made[arch]

    return make


def format_table(rows: list[dict]) -> str:
    head = f"{'backend':<22} {'version':<7} {'case':<44} {'max_err':>9} {'rel_err':>9} {'pass':<5}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['backend']:<22} {r['version']:<7} {r['case']:<44} {r.get('max_err', float('nan')):>9.2e} "
            f"{r.get('rel_err', float('nan')):>9.2e} {('PASS' if r['pass'] else 'FAIL'):<5}"
            + (f" {r['error'][:60]}" if r.get("error") else "")
            + (" NaN" if r.get("nan") else "")
        )
    n_pass = sum(r["pass"] for r in rows)
    lines.append(f"{n_pass}/{len(rows)} passed")
    return "\n".join(lines)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not RESULTS:
        return
    terminalreporter.write_line("")
    terminalreporter.write_line(format_table(RESULTS))
    save_results()


def save_results() -> None:
    """Write the rows so far to $ATTNSERVE_GPU_RESULTS (after every case: a killed run keeps its rows)."""
    path = os.environ.get("ATTNSERVE_GPU_RESULTS")
    if path:
        with open(path, "w") as f:
            json.dump(RESULTS, f, indent=1)
