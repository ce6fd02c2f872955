"""``--baseline transformers``: which models need accelerate (transformers reads a GGUF only with it), checked
before any model loads."""

from __future__ import annotations

import importlib.util

import pytest

from attnserve.benchmarks.hf_baseline import check_transformers_baseline, needs_accelerate

HAVE_ACCELERATE = importlib.util.find_spec("accelerate") is not None


def test_gguf_sources_need_accelerate(tmp_path):
    (tmp_path / "m.gguf").write_bytes(b"")
    assert needs_accelerate(None, "auto")  # the default model is a GGUF
    assert needs_accelerate(str(tmp_path / "m.gguf"), "auto")
    assert needs_accelerate(str(tmp_path), "auto")  # a folder holding a GGUF and no config.json


def test_folders_and_random_weights_do_not(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert not needs_accelerate(str(tmp_path), "auto")
    assert not needs_accelerate("benchmarks/shapes/qwen3-0.6b", "auto")
    assert not needs_accelerate(None, "dummy")


@pytest.mark.skipif(not HAVE_ACCELERATE, reason="accelerate is not installed")
def test_the_check_passes_with_accelerate_installed():
    assert check_transformers_baseline(None, "auto") is None
