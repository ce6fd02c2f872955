"""Device platforms: detection and explicit naming (``cuda:9.0``, ``cpu``)."""

from __future__ import annotations

import functools

from attnserve.platforms.interface import Platform


@functools.lru_cache(maxsize=None)
def detect_platform(device: str = "auto") -> Platform:
    """The platform of ``device`` ("auto", "cpu", "cuda", "cuda:N"), detected once per device string."""
    import torch

    if device == "cpu" or (device == "auto" and not torch.cuda.is_available()):
        return Platform(device_type="cpu", device_name="cpu")
    index = int(device.split(":")[1]) if ":" in device else 0
    props = torch.cuda.get_device_properties(index)
    return Platform(
        device_type="cuda",
        device_name=props.name,
        compute_capability=(props.major, props.minor),
        total_memory=props.total_memory,
    )


__all__ = ["Platform", "detect_platform"]
