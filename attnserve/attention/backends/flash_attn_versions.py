"""FlashAttention's versions (2, 3, 4): their packages, GPUs and limits, which one runs, and its kernels.

Which FlashAttention runs is ``attention_config.flash_attn_version``:

| version | package (pip extra)                         | GPUs (compute capability)       | source of the limits |
| 2       | ``flash_attn`` (``attnserve[fa2]``)          | Ampere, Ada, Hopper: 8.0 to 9.0 | README "FlashAttention-2 currently supports" |
| 3       | ``flash_attn_interface`` (``attnserve[fa3]``) | Hopper: 9.0                     | hopper/README: H100/H800, fp8 forward |
| 4       | ``flash_attn.cute`` (``attnserve[fa4]``)      | Hopper, Blackwell: 9.0 to 10.3  | flash-attn-4 on PyPI: "for Hopper and Blackwell GPUs" |

None picks the best version that is installed and supports this GPU (CC 9.x: 3, 4, 2; CC 10.x: 4;
CC 8.x: 2, 4), preferring one that also supports the model. A version that is not installed, or does not
support this GPU, is a reason naming the package that brings it; it is never silently swapped.

Limits, per version:
* head sizes: multiples of 8 up to 256 (FA2: "all head dimensions up to 256"; FA3 the same); FA4 up to
  128 (Blackwell TMEM limit, Dao-AILab/flash-attention#1959).
* block size: FA2's paged KV requires ``page_block_size`` a multiple of 256 (flash_api.cpp check,
  Dao-AILab/flash-attention#828). FA3 accepts any page size (#1627) and FA4 on SM100 any (#1999); we
  declare multiples of 16 for both, vLLM's contract, which our issue-6 kernels target and §7 relies on.
* fp8 KV cache: FA3 only, e4m3 (fp8 e4m3 forward on Hopper, with q/k/v descales); FA4's
  ``flash_attn_varlen_func`` takes no fp8 input or descale, so the selector refuses fp8 with version 4.
* sinks: FA4 only (``learnable_sink``); upstream FA2/FA3 take no sink argument.
* logits soft cap and sliding window: all three versions (``softcap``, ``window_size``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from attnserve.attention.backend import CudaGraphSupport
from attnserve.attention.capabilities import cc_str
from attnserve.attention.validation import package_installed

if TYPE_CHECKING:  # pragma: no cover
    from attnserve.config.attention import AttentionConfig


@dataclass(frozen=True)
class FlashAttnVersion:
    """The limits of one FlashAttention version (fields override the backend's class attributes)."""

    version: int
    package: str
    pip_extra: str
    min_compute_capability: tuple[int, int]
    max_compute_capability: tuple[int, int]
    kv_cache_dtypes: tuple[str, ...]
    max_head_size: int
    block_size_multiple_of: int
    sinks: bool
    cuda_graph_support: CudaGraphSupport

    def supports_gpu(self, cc: tuple[int, int] | None) -> bool:
        return cc is not None and self.min_compute_capability <= cc <= self.max_compute_capability

    def gpu_rule(self) -> str:
        lo, hi = self.min_compute_capability, self.max_compute_capability
        return cc_str(lo) if lo == hi else f"{cc_str(lo)} to {cc_str(hi)}"


FLASH_ATTN_VERSIONS: dict[int, FlashAttnVersion] = {
    2: FlashAttnVersion(
        2, "flash_attn", "fa2", (8, 0), (9, 0), ("auto",), 256, 256, False, CudaGraphSupport.UNIFORM_BATCH
    ),
    3: FlashAttnVersion(
        3,
        "flash_attn_interface",
        "fa3",
        (9, 0),
        (9, 0),
        ("auto", "fp8", "fp8_e4m3"),
        256,
        16,
        False,
        CudaGraphSupport.ALWAYS,
    ),
    4: FlashAttnVersion(
        4, "flash_attn.cute", "fa4", (9, 0), (10, 3), ("auto",), 128, 16, True, CudaGraphSupport.UNIFORM_BATCH
    ),
}

# Preference by compute-capability major (design §1); other GPUs try FA2 only, which then names its range.
_PREFERENCE: dict[int, tuple[int, ...]] = {8: (2, 4), 9: (3, 4, 2), 10: (4,)}


def version_preference(cc: tuple[int, int] | None) -> tuple[int, ...]:
    """Versions to try for ``flash_attn_version=None`` on a GPU of compute capability ``cc``, best first."""
    return _PREFERENCE.get(cc[0], (2,)) if cc else (2,)


def installed_version(attention_config: "AttentionConfig | None", device: torch.device) -> int:
    """The configured version, else the best installed one for ``device`` (as the selector resolves it)."""
    if attention_config is not None and attention_config.flash_attn_version is not None:
        return attention_config.flash_attn_version
    cc = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    for v in version_preference(cc):
        if FLASH_ATTN_VERSIONS[v].supports_gpu(cc) and package_installed(FLASH_ATTN_VERSIONS[v].package):
            return v
    raise ValueError(
        f"no FlashAttention version installed for compute capability {cc}: pip install 'attnserve[fa3]' (or fa4, fa2)"
    )


def load_kernels(version: int) -> Any:
    """The kernel module of ``version`` (imported here, at Impl/Builder construction, never at import)."""
    if version == 3:
        import flash_attn_interface as mod
    elif version == 4:
        import flash_attn.cute as mod
    elif version == 2:
        import flash_attn as mod
    else:  # pragma: no cover - AttentionConfig validates the choices
        raise ValueError(f"flash_attn_version {version} not supported (supported: 2, 3, 4)")
    return mod
