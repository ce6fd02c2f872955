"""BackendCapabilities: a backend's declared limits as one typed record, and how to print them.

Validation (``validation.py``), the ``attnserve backends`` table and the generated compatibility docs all
read this record, so a limit is written once, in the backend class, and shown the same way everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import torch

from attnserve.attention.backend import AttentionType, CudaGraphSupport, KVCacheLayout

if TYPE_CHECKING:  # pragma: no cover
    from attnserve.attention.backend import AttentionBackend


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


def cc_str(cc: tuple[int, int]) -> str:
    """``(9, 0)`` -> ``"9.0"``."""
    return f"{cc[0]}.{cc[1]}"


@dataclass(frozen=True)
class BackendCapabilities:
    """What a backend (or one FlashAttention version of it) supports. None in a limit means "any".

    ``qualifier`` (e.g. ``"flash_attn_version 3"``) is added to reasons so the user sees which variant
    was judged.
    """

    name: str
    device_types: tuple[str, ...]
    dtypes: tuple[torch.dtype, ...]
    kv_cache_dtypes: tuple[str, ...]
    head_sizes: tuple[int, ...] | None = None
    head_size_multiple_of: int | None = None
    min_head_size: int | None = None
    max_head_size: int | None = None
    block_sizes: tuple[int, ...] | None = None
    block_size_multiple_of: int | None = None
    min_compute_capability: tuple[int, int] | None = None
    max_compute_capability: tuple[int, int] | None = None  # inclusive
    sliding_window: bool = False
    logits_soft_cap: bool = False
    sinks: bool = False
    attn_types: tuple[AttentionType, ...] = (AttentionType.DECODER,)
    required_package: str | None = None
    pip_extra: str | None = None
    install_hint: str | None = None
    required_kv_cache_layout: KVCacheLayout | None = None
    cuda_graph_support: CudaGraphSupport = CudaGraphSupport.NEVER
    qualifier: str | None = None
    # limits that come from how the installed library was built, not from the backend: (field, the build's
    # switches), e.g. ("logits_soft_cap", "FLASHATTENTION_DISABLE_SOFTCAP"); a reason about ``field`` names them
    build_limits: tuple[tuple[str, str], ...] = ()
    # what the installed build compiled out that every call needs: (switch, what it removes), e.g.
    # ("FLASHATTENTION_DISABLE_PAGEDKV", "paged KV cache"); each is a reason of its own (field ``build``)
    build_refusals: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_backend(cls, backend: "type[AttentionBackend]", **overrides) -> "BackendCapabilities":
        """Read the class attributes of ``backend``; ``overrides`` replace single fields."""
        values = dict(
            name=getattr(backend, "name", backend.__name__),
            device_types=tuple(backend.device_types),
            dtypes=tuple(backend.supported_dtypes),
            kv_cache_dtypes=tuple(backend.supported_kv_cache_dtypes),
            head_sizes=backend.supported_head_sizes,
            head_size_multiple_of=backend.head_size_multiple_of,
            min_head_size=backend.min_head_size,
            max_head_size=backend.max_head_size,
            block_sizes=backend.supported_block_sizes,
            block_size_multiple_of=backend.block_size_multiple_of,
            min_compute_capability=backend.min_compute_capability,
            max_compute_capability=backend.max_compute_capability,
            sliding_window=backend.supports_sliding_window,
            logits_soft_cap=backend.supports_logits_soft_cap,
            sinks=backend.supports_sinks,
            attn_types=tuple(backend.supported_attn_types),
            required_package=backend.required_package,
            pip_extra=backend.pip_extra,
            install_hint=backend.install_hint,
            required_kv_cache_layout=backend.required_kv_cache_layout,
            cuda_graph_support=backend.cuda_graph_support,
        )
        unknown = set(overrides) - {f.name for f in fields(cls)}
        assert not unknown, f"unknown capability fields {unknown}"
        values.update(overrides)
        return cls(**values)

    # -- human-readable limits (used in reasons, the CLI table and the docs) --

    def head_size_rule(self) -> str:
        """E.g. ``"64, 128, 256"`` or ``"multiples of 8 up to 256"`` or ``">= 32"`` or ``"any"``."""
        if self.head_sizes is not None:
            return ", ".join(map(str, self.head_sizes))
        parts = []
        if self.head_size_multiple_of:
            parts.append(f"multiples of {self.head_size_multiple_of}")
        if self.min_head_size is not None and self.max_head_size is not None:
            parts.append(f"{self.min_head_size} to {self.max_head_size}")
        elif self.max_head_size is not None:
            parts.append(f"up to {self.max_head_size}")
        elif self.min_head_size is not None:
            parts.append(f">= {self.min_head_size}")
        return " ".join(parts) if parts else "any"

    def head_size_ok(self, head_size: int) -> bool:
        if self.head_sizes is not None:
            return head_size in self.head_sizes
        if self.head_size_multiple_of and head_size % self.head_size_multiple_of:
            return False
        if self.min_head_size is not None and head_size < self.min_head_size:
            return False
        return self.max_head_size is None or head_size <= self.max_head_size

    def block_size_rule(self) -> str:
        """E.g. ``"16, 32, 64"`` or ``"multiples of 16"`` or ``"any"``."""
        if self.block_sizes is not None:
            return ", ".join(map(str, self.block_sizes))
        if self.block_size_multiple_of:
            return f"multiples of {self.block_size_multiple_of}"
        return "any"

    def block_size_ok(self, block_size: int) -> bool:
        if self.block_sizes is not None and block_size not in self.block_sizes:
            return False
        return not (self.block_size_multiple_of and block_size % self.block_size_multiple_of)

    def compute_capability_rule(self) -> str:
        """E.g. ``">= 8.0"``, ``"7.5 to 12.1"``, ``"9.0"``, ``"any"``; ``"-"`` for CPU-only backends."""
        if "cuda" not in self.device_types:
            return "-"
        lo, hi = self.min_compute_capability, self.max_compute_capability
        if lo and hi:
            return cc_str(lo) if lo == hi else f"{cc_str(lo)} to {cc_str(hi)}"
        if lo:
            return f">= {cc_str(lo)}"
        if hi:
            return f"<= {cc_str(hi)}"
        return "any"

    def install_command(self) -> str | None:
        """How to get the required package, e.g. ``pip install 'attnserve[fa3]'``; None if none needed."""
        if self.install_hint:
            return self.install_hint
        if self.pip_extra:
            return f"pip install 'attnserve[{self.pip_extra}]'"
        if self.required_package:
            return f"pip install {self.required_package.split('.')[0]}"
        return None
