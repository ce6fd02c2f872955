"""Whether the skinny-GEMM plan runs: ``use_skinny_gemm`` resolved against the device, CUDA graphs and Triton.

Unset (None), the plan runs wherever it has an effect: a CUDA device, decode steps captured as CUDA graphs,
and Triton importable; elsewhere it is off without a word. True runs it where it has an effect and warns once
where it has none; False never runs it. The engine and ``attnserve config --explain`` call
:func:`resolve_skinny_gemm`; nothing here touches a device.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from dataclasses import dataclass

logger = logging.getLogger("attnserve.gemv")


@dataclass(frozen=True)
class SkinnyGemm:
    """The resolved switch: ``on``, why (``reason``: what it lacks when off, else what it has), and whether an
    explicit True is ignored (``warn``)."""

    on: bool
    reason: str
    warn: bool = False

    def warning(self) -> str:
        """The one warning line for an explicit ``use_skinny_gemm`` True that has no effect here."""
        if self.reason == "Triton not installed":
            return "use_skinny_gemm has no effect here: the GEMV plan needs Triton, which is not installed"
        return (
            "use_skinny_gemm has no effect here: the Triton GEMV runs in CUDA-graph decode steps only "
            f"(this engine: {self.reason})"
        )

    def explained(self) -> str:
        """``config --explain``'s words: ``on (...)`` or ``off (...)``."""
        return f"{'on' if self.on else 'off'} ({self.reason})"


@functools.cache
def triton_installed() -> bool:
    """Whether Triton can be imported (looked up, not imported)."""
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):
        return False


def resolve_skinny_gemm(requested: bool | None, device_type: str, cuda_graphs: bool, triton: bool) -> SkinnyGemm:
    """``use_skinny_gemm`` (``requested``: True, False or None for unset) on a ``device_type`` ("cuda" or "cpu")
    engine that captures CUDA graphs or not, with Triton importable or not."""
    if requested is False:
        return SkinnyGemm(False, "use_skinny_gemm false")
    lacks = "no CUDA" if device_type != "cuda" else "CUDA graphs off" if not cuda_graphs else None
    if lacks is None and not triton:
        lacks = "Triton not installed"
    if lacks is not None:
        return SkinnyGemm(False, lacks, warn=requested is True)
    return SkinnyGemm(True, "CUDA, CUDA graphs, Triton")


def warn_if_ignored(skinny: SkinnyGemm) -> None:
    """Log :meth:`SkinnyGemm.warning` when an explicit True has no effect (``skinny.warn``)."""
    if skinny.warn:
        logger.warning(skinny.warning())
