"""docs/attention_backends.md is generated from the backend classes; this fails when it is stale."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_backend_docs_are_up_to_date():
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "tools" / "generate_attention_backend_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    committed = (ROOT / "docs" / "attention_backends.md").read_text()
    assert committed == module.render(), (
        "docs/attention_backends.md is stale: run python tools/generate_attention_backend_docs.py"
    )
