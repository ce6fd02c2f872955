"""FlashAttention's versions (2, 3, 4): their packages, GPUs and limits, which one runs, and its kernels.

Which FlashAttention runs is ``attention_config.flash_attn_version``:

| version | package (pip extra)                         | GPUs (compute capability)       | source of the limits |
| 2       | ``flash_attn`` (``attnserve[fa2]``)          | Ampere, Ada, Hopper: 8.0 to 9.0 | README "FlashAttention-2 currently supports" |
| 3       | ``flash_attn_interface`` (``attnserve[fa3]``) | Hopper: 9.0                     | hopper/README: H100/H800, fp8 forward |
| 4       | ``flash_attn.cute`` (``attnserve[fa4]``)      | Hopper, Blackwell: 9.0 to 10.3  | flash-attn-4 on PyPI: "for Hopper and Blackwell GPUs" |

None picks the best version that is installed and supports this GPU (CC 9.x: 3, 4, 2; CC 10.x: 4;
CC 8.x: 2), preferring one that also supports the model. A version that is not installed, or does not
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

These are the declared limits. An FA3 build may compile features out (hopper/setup.py's
``FLASH_ATTENTION_DISABLE_*`` variables); its wheel then ships ``flash_attn_config.py``, a top-level module
beside ``flash_attn_interface`` whose ``CONFIG["build_flags"]`` records the switches (True = compiled out).
:func:`installed_build` reads it and :meth:`FlashAttnBuild.narrow` takes from FA3's limits what the build
lacks, each limit naming its switch: ``..._SOFTCAP`` (soft cap), ``..._LOCAL`` (sliding window), ``..._FP8``
(fp8 KV cache), ``..._FP16`` (float16), ``..._HDIM64/96/128/192/256`` (the kernel takes the smallest compiled
head size >= the model's, so the largest compiled one bounds the head size); ``..._PAGEDKV`` and ``..._VARLEN``
refuse FA3 outright (every call passes a page table and ``cu_seqlens_q``). ``..._SM8x`` changes nothing: FA3
is declared for Hopper only, with or without its Ampere kernels. No importable build config (FA3 not
installed, or a build older than the file): the declared limits.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from attnserve.attention.backend import CudaGraphSupport
from attnserve.attention.capabilities import BackendCapabilities, cc_str
from attnserve.attention.validation import package_installed
from attnserve.refusals import backends as words

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
# Each lists only versions whose GPU range holds that major (FA4 starts at 9.0: not on Ampere or Ada).
_PREFERENCE: dict[int, tuple[int, ...]] = {8: (2,), 9: (3, 4, 2), 10: (4,)}


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
    raise ValueError(words.no_version_installed(cc))


# the module a version's build writes its compile-time switches to (FA3: hopper/setup.py's create_build_config_file)
BUILD_CONFIG_MODULES: dict[int, str] = {3: "flash_attn_config"}
_PREFIX = "FLASHATTENTION_DISABLE_"
HEAD_SIZE_KERNELS = (64, 96, 128, 192, 256)  # FA3's compiled head sizes (round_up_headdim)
# switch -> what attnserve's every call needs and the switch removes
_REFUSING = {"PAGEDKV": "paged KV cache", "VARLEN": "variable-length batches (cu_seqlens_q)"}


@dataclass(frozen=True)
class FlashAttnBuild:
    """The compile-time switches of an installed FlashAttention build: the names, without the
    ``FLASHATTENTION_DISABLE_`` prefix, of the features it compiled out (``"SOFTCAP"``, ``"HDIM96"``, ...)."""

    version: int
    disabled: frozenset[str]

    def narrow(self, caps: BackendCapabilities) -> BackendCapabilities:
        """``caps`` (this version's declared limits) less what the build compiled out; every narrowed field is
        in ``build_limits`` with its switch, every missing necessity in ``build_refusals`` (module docstring)."""
        changes: dict[str, Any] = {}
        limits: list[tuple[str, str]] = []

        def off(switch: str, field: str, value: Any, new: Any) -> None:
            if switch in self.disabled and value != new:
                changes[field] = new
                limits.append((_capability_field(field), _PREFIX + switch))

        off("SOFTCAP", "logits_soft_cap", caps.logits_soft_cap, False)
        off("LOCAL", "sliding_window", caps.sliding_window, False)
        off("FP8", "kv_cache_dtypes", caps.kv_cache_dtypes, tuple(d for d in caps.kv_cache_dtypes if "fp8" not in d))
        off("FP16", "dtypes", caps.dtypes, tuple(d for d in caps.dtypes if d != torch.float16))
        compiled = [h for h in HEAD_SIZE_KERNELS if f"HDIM{h}" not in self.disabled]
        largest = max(compiled, default=0)
        if caps.max_head_size is not None and largest < caps.max_head_size:
            changes["max_head_size"] = largest
            if not compiled:
                changes["head_sizes"] = ()
            cut = [_PREFIX + f"HDIM{h}" for h in HEAD_SIZE_KERNELS if h > largest and f"HDIM{h}" in self.disabled]
            limits.append(("head_size", ", ".join(cut)))
        refusals = tuple((_PREFIX + s, what) for s, what in _REFUSING.items() if s in self.disabled)
        return dataclasses.replace(
            caps,
            **changes,
            build_limits=caps.build_limits + tuple(limits),
            build_refusals=caps.build_refusals + refusals,
        )


def _capability_field(field: str) -> str:
    """The selector-config field (a reason's ``field``) a BackendCapabilities field limits."""
    return {"kv_cache_dtypes": "kv_cache_dtype", "dtypes": "dtype"}.get(field, field)


def installed_build(version: int) -> FlashAttnBuild | None:
    """The installed build of FlashAttention ``version`` as its build config module records it, or None where
    there is none to read (another version, FA3 not installed, a build without the file, a file without a
    ``CONFIG["build_flags"]`` mapping). Imports only that small module (already imported: read from
    ``sys.modules``), never the kernels."""
    name = BUILD_CONFIG_MODULES.get(version)
    if name is None or not package_installed(FLASH_ATTN_VERSIONS[version].package):
        return None  # a build file left without the kernels describes nothing installed
    module = sys.modules.get(name)
    if module is None:
        if not package_installed(name):
            return None
        try:
            module = importlib.import_module(name)
        except Exception:  # a broken file is no build description: the declared limits stand
            return None
    config = getattr(module, "CONFIG", None)
    flags = config.get("build_flags") if isinstance(config, dict) else None
    if not isinstance(flags, dict):
        return None
    disabled = frozenset(k.removeprefix(_PREFIX) for k, v in flags.items() if k.startswith(_PREFIX) and v is True)
    return FlashAttnBuild(version, disabled)


def as_built(version: int, caps: BackendCapabilities) -> BackendCapabilities:
    """``caps``, FlashAttention ``version``'s declared limits, narrowed by its installed build (if it has a
    build config); otherwise ``caps`` unchanged."""
    build = installed_build(version)
    return build.narrow(caps) if build is not None else caps


def load_kernels(version: int) -> Any:
    """The kernel module of ``version`` (imported here, at Impl/Builder construction, never at import)."""
    if version == 3:
        import flash_attn_interface as mod
    elif version == 4:
        import flash_attn.cute as mod
    elif version == 2:
        import flash_attn as mod
    else:  # pragma: no cover - AttentionConfig validates the choices
        raise ValueError(words.version_unknown(version))
    return mod
