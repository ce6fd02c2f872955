"""Every installed GPU attention backend (each FlashAttention version) against the reference, on the
named batch shapes of tests/gpu/cases.py. Run on a GPU machine: ``pytest tests/gpu -m gpu -s``."""

from __future__ import annotations

import traceback

import pytest
import torch

from tests.gpu.backends import gpu_targets
from tests.gpu.cases import run_case
from tests.gpu.conftest import RESULTS, save_results

pytestmark = pytest.mark.gpu

PARAMS = [
    pytest.param(label, name, cfg, case, id=f"{label}-{case.name}")
    for label, name, cfg, cases in (gpu_targets() if torch.cuda.is_available() else [])
    for case in cases
]


@pytest.mark.parametrize("label,backend_name,attention_config,case", PARAMS)
def test_backend_matches_reference(label, backend_name, attention_config, case):
    from attnserve.attention.registry import AttentionBackendEnum

    backend_cls = AttentionBackendEnum[backend_name].get_class()
    version = label.split("/")[1] if "/" in label else "-"
    row = {
        "backend": label.split("/")[0] if version.isdigit() else label,
        "version": version if version.isdigit() else "-",
        "case": case.name,
    }
    try:
        row.update(run_case(backend_cls, case, "cuda", attention_config))
    except Exception as e:  # recorded in the table, then re-raised
        row.update({"pass": False, "error": f"{type(e).__name__}: {e}".replace("\n", " ")})
        RESULTS.append(row)
        save_results()
        print(row["backend"], row["version"], case.name, "ERROR", traceback.format_exc()[-1500:], flush=True)
        raise
    RESULTS.append(row)
    save_results()
    print(f"{row['backend']} {row['version']} {case.name} rel_err={row['rel_err']:.2e} pass={row['pass']}", flush=True)
    assert not row["nan"], "NaN in the output"
    assert row["pass"], row
