"""Attention backend selection: explicit choice validated, or the platform's priority list walked (§4)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from attnserve.attention.backend import AttentionBackend, AttentionType
from attnserve.attention.registry import AttentionBackendEnum
from attnserve.platforms.interface import Platform

logger = logging.getLogger(__name__)


class NoUsableBackendError(ValueError):
    """No backend (or not the explicitly chosen one) can run the model; the message has every reason."""


@dataclass(frozen=True)
class AttentionSelectorConfig:
    """What a backend must support to run a model's attention layers."""

    head_size: int
    dtype: torch.dtype
    kv_cache_dtype: str = "auto"
    block_size: int = 16
    sliding_window: int | None = None
    logits_soft_cap: float | None = None
    has_sink: bool = False
    attn_type: AttentionType = AttentionType.DECODER


def backend_reasons(member: AttentionBackendEnum, selector_config: AttentionSelectorConfig, platform: Platform) -> tuple[type[AttentionBackend] | None, list[str]]:
    """Import ``member``'s class and return it with its reasons (a missing module is a reason)."""
    try:
        cls = member.get_class()
    except (ImportError, ValueError) as e:
        return None, [f"cannot be loaded: {e}"]
    return cls, cls.validate(selector_config, platform)


def get_attn_backend(
    backend: AttentionBackendEnum | None, selector_config: AttentionSelectorConfig, platform: Platform
) -> type[AttentionBackend]:
    """Return the backend class to use. Raises NoUsableBackendError with every reason."""
    if backend is not None:
        cls, reasons = backend_reasons(backend, selector_config, platform)
        if reasons:
            raise NoUsableBackendError(
                f"attention backend {backend.name} cannot run this model on {platform.description}: "
                + "; ".join(reasons)
            )
        return cls
    all_reasons = {}
    for member in platform.backend_priorities():
        cls, reasons = backend_reasons(member, selector_config, platform)
        if not reasons:
            logger.info("Using %s attention backend out of potential backends: %s", member.name,
                        [m.name for m in platform.backend_priorities()])
            return cls
        all_reasons[member.name] = reasons
    raise NoUsableBackendError(
        f"no attention backend can run this model on {platform.description}: "
        + " | ".join(f"{name}: {'; '.join(r)}" for name, r in all_reasons.items())
    )
