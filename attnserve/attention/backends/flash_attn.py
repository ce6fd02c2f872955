"""FLASH_ATTN: FlashAttention 2, 3 or 4 over a paged KV cache.

One backend over three libraries; the builder resolves the version once and the impl calls it:
* 3 (``flash_attn_interface``): ``flash_attn_with_kvcache`` with ``page_table``, ``cu_seqlens_q`` and
  ``cache_seqlens`` runs a whole mixed batch in one call; the builder computes ``get_scheduler_metadata``
  (the split-KV plan) once per step. fp8 KV cache: the query is quantized to e4m3 with a per-tensor scale
  computed from its absolute maximum, and the three descales go to the kernel.
* 4 (``flash_attn.cute``): ``flash_attn_varlen_func`` with ``page_table`` and ``seqused_k``.
* 2 (``flash_attn``): ``flash_attn_varlen_func`` with ``block_table`` (needs ``cu_seqlens_k``) for mixed
  batches and ``flash_attn_with_kvcache`` for the decode call.
With ``use_prefill_decode_attention`` each step makes two calls: decodes (query length 1), then prefills.
Layout NHD ``(2, num_blocks, block_size, num_kv_heads, head_size)``.

This file: the backend's declaration and its selection (which version runs, the reasons it cannot). Each
version's limits (head sizes, block size, fp8, GPUs, the installed build's): ``flash_attn_versions.py``. The
metadata builder and the Impl (the kernel calls): ``flash_attn_calls.py``; cascade attention's calls:
``flash_attn_cascade.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch

from attnserve.attention.backend import AttentionBackend, AttentionType, CudaGraphSupport
from attnserve.attention.capabilities import BackendCapabilities, cc_str
from attnserve.attention.backends.flash_attn_versions import FLASH_ATTN_VERSIONS, as_built, version_preference
from attnserve.attention.validation import capability_reasons, package_installed
from attnserve.refusals import Reason
from attnserve.refusals import backends as words

if TYPE_CHECKING:  # pragma: no cover
    from attnserve.attention.backends.flash_attn_calls import FlashAttentionImpl, FlashAttentionMetadataBuilder
    from attnserve.attention.selector import AttentionSelectorConfig
    from attnserve.config.attention import AttentionConfig
    from attnserve.platforms.interface import Platform


class FlashAttentionBackend(AttentionBackend):
    """FlashAttention (Dao-AILab) over a paged KV cache. Class attributes are the union over versions;
    :meth:`capabilities` gives one version's limits."""

    name: ClassVar[str] = "FLASH_ATTN"
    supported_dtypes = (torch.float16, torch.bfloat16)
    supported_kv_cache_dtypes = ("auto", "fp8", "fp8_e4m3")  # fp8: version 3 only
    head_size_multiple_of = 8
    max_head_size = 256
    block_size_multiple_of = 16
    min_compute_capability = (8, 0)
    max_compute_capability = (10, 3)
    supports_sliding_window = True
    supports_logits_soft_cap = True
    supports_sinks = True  # version 4 only
    supported_attn_types = (AttentionType.DECODER, AttentionType.ENCODER_ONLY)
    device_types = ("cuda",)
    required_package = "flash_attn_interface"  # the default version's; see FLASH_ATTN_VERSIONS
    pip_extra = "fa3"
    cuda_graph_support = CudaGraphSupport.ALWAYS  # version 3; 2 and 4: UNIFORM_BATCH

    @staticmethod
    def get_impl_cls() -> type["FlashAttentionImpl"]:
        from attnserve.attention.backends.flash_attn_calls import FlashAttentionImpl

        return FlashAttentionImpl

    @staticmethod
    def get_builder_cls() -> type["FlashAttentionMetadataBuilder"]:
        from attnserve.attention.backends.flash_attn_calls import FlashAttentionMetadataBuilder

        return FlashAttentionMetadataBuilder

    @classmethod
    def version_capabilities(cls, version: int, declared: bool = False) -> BackendCapabilities:
        """The limits of FlashAttention ``version`` (2, 3 or 4), less what its installed build compiled out
        (``flash_attn_versions.as_built``); ``declared``: as declared, whatever is installed (the docs, and
        planning for another machine: ``assume_installed``)."""
        v = FLASH_ATTN_VERSIONS[version]
        caps = BackendCapabilities.from_backend(
            cls,
            kv_cache_dtypes=v.kv_cache_dtypes,
            max_head_size=v.max_head_size,
            block_size_multiple_of=v.block_size_multiple_of,
            min_compute_capability=v.min_compute_capability,
            max_compute_capability=v.max_compute_capability,
            sinks=v.sinks,
            required_package=v.package,
            pip_extra=v.pip_extra,
            cuda_graph_support=v.cuda_graph_support,
            qualifier=f"flash_attn_version {version}",
        )
        return caps if declared else as_built(version, caps)

    @classmethod
    def capabilities(cls, platform=None, attention_config=None, assume_installed=False) -> BackendCapabilities:
        version = attention_config.flash_attn_version if attention_config is not None else None
        if version is None and platform is not None:
            version = cls.resolve_version(None, platform, attention_config, assume_installed)
        return cls.version_capabilities(version, assume_installed) if version else BackendCapabilities.from_backend(cls)

    @classmethod
    def resolve_version(
        cls,
        selector_config: "AttentionSelectorConfig | None",
        platform: "Platform",
        attention_config: "AttentionConfig | None" = None,
        assume_installed: bool = False,
    ) -> int | None:
        """The FlashAttention version that would run: the configured one, else the best installed version
        for this GPU (one that also supports ``selector_config`` when given). None when there is none."""
        if attention_config is not None and attention_config.flash_attn_version is not None:
            return attention_config.flash_attn_version
        cc = platform.compute_capability
        usable = [
            v
            for v in version_preference(cc)
            if FLASH_ATTN_VERSIONS[v].supports_gpu(cc)
            and (assume_installed or package_installed(FLASH_ATTN_VERSIONS[v].package))
        ]
        if not usable:
            return None
        if selector_config is not None:
            for v in usable:
                if not capability_reasons(
                    cls.version_capabilities(v, assume_installed), selector_config, platform, assume_installed=True
                ):
                    return v
        return usable[0]

    @classmethod
    def validate(cls, selector_config, platform, attention_config=None, assume_installed=False) -> list[Reason]:
        reasons = cls._version_reasons(selector_config, platform, attention_config, assume_installed)
        return reasons + cls._graph_splits_reasons(selector_config, platform, attention_config, assume_installed)

    @classmethod
    def _graph_splits_reasons(cls, selector_config, platform, attention_config, assume_installed) -> list[Reason]:
        """``flash_attn_max_num_splits_for_cuda_graph`` set away from its default means FlashAttention 3's graph
        plan: refused with the versions that have none (2, 4)."""
        from attnserve.config.attention import AttentionConfig

        splits = attention_config.flash_attn_max_num_splits_for_cuda_graph if attention_config is not None else None
        if splits is None or splits == AttentionConfig().flash_attn_max_num_splits_for_cuda_graph:
            return []
        version = attention_config.flash_attn_version
        if version is None and platform.device_type == "cuda":
            version = cls.resolve_version(selector_config, platform, attention_config, assume_installed)
        if version in (None, 3):
            return []
        return [words.graph_splits_need_fa3(splits, version)]

    @classmethod
    def _version_reasons(cls, selector_config, platform, attention_config=None, assume_installed=False) -> list[Reason]:
        requested = attention_config.flash_attn_version if attention_config is not None else None
        if platform.device_type != "cuda":  # every reason, judged against the version(s) that could be installed
            versions = [requested] if requested is not None else list(version_preference((9, 0)))
            caps = cls.version_capabilities(versions[0], assume_installed)
            reasons = capability_reasons(caps, selector_config, platform, assume_installed=True)
            if not assume_installed and not any(package_installed(FLASH_ATTN_VERSIONS[v].package) for v in versions):
                extras = [FLASH_ATTN_VERSIONS[v].pip_extra for v in versions]
                reasons.insert(1, words.install_extras(extras, FLASH_ATTN_VERSIONS[versions[0]].package))
            return reasons
        cc = platform.compute_capability
        if requested is not None:
            v = FLASH_ATTN_VERSIONS[requested]
            reasons = []
            if not v.supports_gpu(cc):
                reasons.append(words.version_not_on_gpu(requested, cc, cc_str(cc) if cc else "", v.gpu_rule()))
            if not assume_installed and not package_installed(v.package):
                reasons.append(words.version_not_installed(requested, v.pip_extra, v.package))
            caps = cls.version_capabilities(requested, assume_installed)
            # the GPU and package reasons above are the version-specific wording of these two checks
            caps_reasons = capability_reasons(caps, selector_config, platform, assume_installed=True)
            return reasons + [r for r in caps_reasons if r.field != "compute_capability"]
        candidates = [v for v in version_preference(cc) if FLASH_ATTN_VERSIONS[v].supports_gpu(cc)]
        if not candidates:
            return [cls._gpu_reason(cc)]
        version = cls.resolve_version(selector_config, platform, attention_config, assume_installed)
        if version is None:
            extras = [FLASH_ATTN_VERSIONS[v].pip_extra for v in candidates]
            # judge the model too, against the version that would run once installed: every reason at once
            would_be = cls.resolve_version(selector_config, platform, attention_config, assume_installed=True)
            return [words.install_extras(extras, FLASH_ATTN_VERSIONS[candidates[0]].package)] + capability_reasons(
                cls.version_capabilities(would_be, assume_installed), selector_config, platform, assume_installed=True
            )
        return capability_reasons(
            cls.version_capabilities(version, assume_installed), selector_config, platform, assume_installed=True
        )

    @staticmethod
    def _gpu_reason(cc: tuple[int, int] | None) -> Reason:
        lowest = min(v.min_compute_capability for v in FLASH_ATTN_VERSIONS.values())
        if cc is None:
            return words.UNKNOWN_CAPABILITY
        if cc < lowest:
            return words.capability_below(cc, cc_str(cc), cc_str(lowest))
        return words.capability_between(cc, cc_str(cc), {n: v.gpu_rule() for n, v in FLASH_ATTN_VERSIONS.items()})
