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


def test_flash_attn_preference_lists_only_versions_that_run_there():
    """The notes' version order per GPU generation is the selector's: no version that GPU refuses (FA4 on CC 8.x)."""
    from attnserve.attention.backends.flash_attn_versions import _PREFERENCE, FLASH_ATTN_VERSIONS

    for major, versions in _PREFERENCE.items():
        assert all(FLASH_ATTN_VERSIONS[v].supports_gpu((major, 0)) for v in versions), (major, versions)
    assert "CC 8.x: 2)" in (ROOT / "docs" / "attention_backends.md").read_text()


def test_trtllm_help_says_the_kernels_are_not_wired():
    """The help of use_trtllm_attention says what the code does: true is refused, the kernels are not wired."""
    from attnserve.config.attention import AttentionConfig
    from attnserve.config.fields import field_docs

    doc = field_docs(AttentionConfig)["use_trtllm_attention"]
    assert "does not wire" in doc and "true is refused" in doc
