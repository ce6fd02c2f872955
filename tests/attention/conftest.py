"""Shared helpers for the attention tests: selector configs, simulated platforms, a clean registry."""

from __future__ import annotations

import pytest
import torch

from attnserve.attention import registry
from attnserve.attention.selector import AttentionSelectorConfig, clear_backend_cache
from attnserve.platforms import detect_platform


def cfg(head_size: int = 128, dtype: torch.dtype = torch.bfloat16, **kw) -> AttentionSelectorConfig:
    return AttentionSelectorConfig(head_size=head_size, dtype=dtype, **kw)


def cuda(cc: str):
    return detect_platform(f"cuda:{cc}")


@pytest.fixture(autouse=True)
def clean_registry():
    """Every test starts and ends with no registrations and an empty selection cache."""
    saved = (dict(registry._PATHS), dict(registry._CLASSES))
    yield
    registry._PATHS.clear()
    registry._PATHS.update(saved[0])
    registry._CLASSES.clear()
    registry._CLASSES.update(saved[1])
    clear_backend_cache()


@pytest.fixture
def cpu_attn_backend():
    """CPU_ATTN's class; skipped while its module (written in the engine branch) is missing."""
    try:
        return registry.AttentionBackendEnum.CPU_ATTN.get_class()
    except ImportError:
        pytest.skip("attnserve.attention.backends.cpu_attn not in this build")
