"""The words of a device the engine cannot run on: a simulated GPU (planning only), a GPU this machine does not
have, a device setting that names none, fewer GPUs than tensor-parallel ranks, Ray missing for its executor.

``platforms/``, ``config/engine.py`` and ``distributed/sharding.py`` refuse with these.
"""

from __future__ import annotations

from attnserve.refusals import Refusal

RUNNABLE = "auto, cpu, cuda, cuda:N"
"""The device settings the engine runs on (a simulated ``cuda:MAJOR.MINOR`` only plans)."""


def device_words(devices: tuple[str, ...] | list[str]) -> str:
    return f"{', '.join(devices)}, cuda:N, cuda:MAJOR.MINOR to plan for a simulated GPU"


def simulated_gpu(device: str) -> Refusal:
    """A simulated GPU (``cuda:9.0``) given to the engine, which only ``attnserve backends`` / ``config`` plan for."""
    return Refusal(
        ("device",),
        device,
        reason=f"is a simulated GPU (compute capability {device.split(':', 1)[1]}) for planning "
        "with `attnserve backends` / `attnserve config`; the engine cannot run on it: use auto, cpu, cuda or cuda:N",
    )


def devices_here(gpus: int) -> str:
    """The devices this machine has, as the allowed values of a device that is not here."""
    return "auto, cpu" if gpus == 0 else f"auto, cpu, cuda, cuda:0..{gpus - 1}"


def not_understood(device: str) -> Refusal:
    return Refusal(("device",), device, f"{RUNNABLE}, cuda:MAJOR.MINOR such as cuda:9.0", reason="not understood")


def not_runnable(device: str) -> str:
    return f"device {device!r} is not a device the engine runs on (allowed: {RUNNABLE})"


def no_cuda(index: int) -> Refusal:
    return Refusal(("device",), reason=f"cuda:{index} requested but CUDA is not available on this machine")


def no_such_gpu(index: int, count: int) -> Refusal:
    return Refusal(("device",), reason=f"cuda:{index} requested but this machine has {count} GPU(s)")


def too_few_gpus(n: int, count: int, visible: str | None) -> Refusal:
    shown = f"{count}" + (f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else "")
    return Refusal(("tensor_parallel_size",), n, reason=f"needs {n} GPUs (one per rank); this host shows {shown}")


RAY_INSTALL = "pip install 'attnserve[ray]'"


def no_ray() -> str:
    """``distributed_executor_backend ray`` without Ray installed."""
    return f"distributed_executor_backend ray needs Ray; install it with: {RAY_INSTALL}"
