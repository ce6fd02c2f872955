"""CPU: the platform record and its backend priority list."""

from __future__ import annotations

import platform as _stdlib_platform

from attnserve.attention.registry import AttentionBackendEnum
from attnserve.platforms.interface import Platform


def cpu_backend_priorities() -> list[AttentionBackendEnum]:
    return [AttentionBackendEnum.CPU_ATTN, AttentionBackendEnum.FLEX_ATTENTION]


def cpu_platform() -> Platform:
    return Platform(device_type="cpu", device_name=f"cpu ({_stdlib_platform.machine() or 'unknown'})")
