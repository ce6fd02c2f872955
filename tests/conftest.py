"""Shared fixtures: the default model loaded once, tiny random-weight models saved as safetensors."""

from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def default_llm():
    """The default model (SmolLM2-135M-Instruct GGUF) on CPU in float32, with CPU_ATTN."""
    from attnserve import LLM

    return LLM(dtype="float32", device="cpu", attention_backend="CPU_ATTN")
