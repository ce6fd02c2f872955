"""Device platforms: detection (once per device string) and explicit naming for planning.

Device strings: ``auto`` (the first GPU if CUDA is available, else the CPU), ``cpu``, ``cuda``,
``cuda:N`` (GPU N of this machine) and ``cuda:MAJOR.MINOR`` (a simulated GPU of that compute
capability, e.g. ``cuda:9.0``; nothing is detected).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import TYPE_CHECKING

from attnserve.platforms.interface import Platform
from attnserve.refusals import Refused
from attnserve.refusals import devices as words

if TYPE_CHECKING:  # pragma: no cover
    import torch

_SIMULATED = re.compile(r"^cuda:(\d+)\.(\d+)$")
_INDEXED = re.compile(r"^cuda(?::(\d+))?$")


def is_simulated_device(device: str) -> bool:
    """True for ``cuda:MAJOR.MINOR``: a GPU named for planning, which the engine cannot run on."""
    return bool(_SIMULATED.match(device.strip().lower()))


def check_runnable_device(device: str) -> None:
    """Raise ConfigError (a ValueError keyed ``device``, so the CLI names ``--device``), before any model loads,
    when the engine cannot run on ``device``: a simulated GPU (``cuda:9.0``, planning only) or a CUDA device
    this machine does not have; the message says which devices it does have."""
    from attnserve.config.fields import ConfigError

    if is_simulated_device(device):
        raise ConfigError(words.simulated_gpu(device))
    try:
        detect_platform(device)  # raises for cuda / cuda:N without that GPU
    except Refused as e:
        import torch

        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        raise ConfigError(dataclasses.replace(e.refusal, allowed=words.devices_here(n))) from None


@functools.lru_cache(maxsize=None)
def detect_platform(device: str = "auto") -> Platform:
    """The platform named by ``device`` (see the module docstring). Raises ValueError for a bad string."""
    from attnserve.platforms.cpu import cpu_platform
    from attnserve.platforms.cuda import detect_cuda_platform, simulated_cuda_platform

    text = device.strip().lower()
    if text == "cpu":
        return cpu_platform()
    if m := _SIMULATED.match(text):
        return simulated_cuda_platform((int(m.group(1)), int(m.group(2))))
    if text == "auto":
        import torch

        return detect_cuda_platform(0) if torch.cuda.is_available() else cpu_platform()
    if m := _INDEXED.match(text):
        return detect_cuda_platform(int(m.group(1) or 0))
    raise Refused(words.not_understood(device))


def runtime_device(device: str) -> "torch.device":
    """The torch.device the engine runs on for the device setting ``device``, with its index, so that what names it
    (the KV-cache lines) says which GPU: ``cpu``; ``cuda:N``; ``cuda`` and ``auto`` (with CUDA): the current CUDA
    device, ``cuda:0`` unless this process chose another. Raises ValueError for a simulated GPU or a bad string
    (:func:`check_runnable_device` says which first)."""
    import torch

    text = device.strip().lower()
    if text == "cpu" or (text == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    m = _INDEXED.match(text)
    if m is None and text != "auto":
        raise ValueError(words.not_runnable(device))
    if m is not None and m.group(1) is not None:
        return torch.device("cuda", int(m.group(1)))
    return torch.device("cuda", torch.cuda.current_device())


__all__ = ["Platform", "check_runnable_device", "detect_platform", "is_simulated_device", "runtime_device"]
