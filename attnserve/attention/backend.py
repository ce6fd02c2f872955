"""The attention-backend contract.

A backend module ``attnserve/attention/backends/<name>.py`` exports four classes:

* ``<Name>Backend``: static facts (what it supports, which package it needs, the KV-cache shape) and
  factories for the three others. ``validate(selector_config, platform)`` returns the reasons it cannot
  run a model on a platform; an empty list means usable.
* ``<Name>Metadata``: a dataclass with the kernel arguments of one step.
* ``<Name>MetadataBuilder``: built once per model runner; ``build(common)`` runs once per step and turns
  the step's :class:`CommonAttentionMetadata` into ``<Name>Metadata``.
* ``<Name>Impl``: one per attention layer; ``forward`` writes the step's new K/V into the paged cache and
  computes attention for the step's query tokens. An Impl may expose where that write goes
  (``kv_write_target``): the layer's RoPE kernel then writes K/V itself and ``forward`` gets
  ``kv_written=True``.

Shapes follow vLLM's ``v1/attention/backend.py`` (the interface users and kernel authors know). Within a
step the scheduler orders requests with decodes (query length 1) first, then prefills (chunked or not).
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from attnserve.attention.cascade import CascadePrefix
from attnserve.attention.kv_cache_dtype import (
    K_SCALE_CONSTANT,
    Q_SCALE_CONSTANT,
    V_SCALE_CONSTANT,
    first_bad_kv_scale,
)
from attnserve.refusals import Refused
from attnserve.refusals.backends import bad_kv_scale, sinks_not_in_kernel

if TYPE_CHECKING:  # pragma: no cover
    from attnserve.attention.capabilities import BackendCapabilities
    from attnserve.kernels.fused_ops import RopeInputs
    from attnserve.kernels.kv_write import KVWriteTarget
    from attnserve.refusals import Reason
    from attnserve.attention.selector import AttentionSelectorConfig
    from attnserve.config.attention import AttentionConfig
    from attnserve.platforms.interface import Platform


class AttentionType(str, enum.Enum):
    """Which tokens a layer attends to. Only causal decoder self-attention runs in this engine so far."""

    DECODER = "decoder"
    ENCODER_ONLY = "encoder_only"


class KVCacheLayout(str, enum.Enum):
    """Memory order of one block of the paged KV cache.

    NHD: ``(block_size, num_kv_heads, head_size)`` per block; HND: ``(num_kv_heads, block_size, head_size)``.
    """

    NHD = "NHD"
    HND = "HND"


class CudaGraphSupport(enum.IntEnum):
    """How much of a step a backend can run inside a captured CUDA graph (vLLM's AttentionCGSupport)."""

    NEVER = 0
    UNIFORM_SINGLE_TOKEN_DECODE = 1  # pure-decode batches only
    UNIFORM_BATCH = 2  # batches where every request has the same query length
    ALWAYS = 3  # any batch, mixed prefill and decode included


@dataclass
class CommonAttentionMetadata:
    """The per-step attention inputs shared by every backend; built once per step by the model runner.

    B is the number of requests in the step, T the number of query tokens (sum of query lengths).
    Requests are ordered decodes first, then prefills.
    """

    query_start_loc: torch.Tensor  # (B + 1,) int32 on device: cumulative query lengths, starts at 0
    query_start_loc_cpu: torch.Tensor  # (B + 1,) int32 on CPU, same values
    seq_lens: torch.Tensor  # (B,) int32 on device: context length of each request after this step
    seq_lens_cpu: torch.Tensor  # (B,) int32 on CPU, same values
    block_table: torch.Tensor  # (B, max_blocks_per_seq) int32 on device, physical block ids, 0 padding
    slot_mapping: torch.Tensor  # (T,) int64 on device: flat cache slot of each new token, -1 = skip
    num_reqs: int
    num_actual_tokens: int  # T
    max_query_len: int
    max_seq_len: int
    num_decodes: int  # requests with query length 1, all before the prefills
    num_decode_tokens: int  # == num_decodes
    block_size: int
    # (B, max_blocks_per_seq) int32 on CPU, same values as block_table; None when the caller has no host copy
    block_table_cpu: torch.Tensor | None = None
    # a prefix every request shares (cascade attention, pure-decode steps only): then block_table and
    # seq_lens describe each request's suffix after it; None = no cascade
    cascade: CascadePrefix | None = None

    @property
    def num_prefills(self) -> int:
        return self.num_reqs - self.num_decodes

    @property
    def query_lens_cpu(self) -> torch.Tensor:  # (B,) int32
        return self.query_start_loc_cpu[1:] - self.query_start_loc_cpu[:-1]


@dataclass(frozen=True)
class AttentionLayerSpec:
    """What one attention layer needs from its backend's Impl; given at model construction."""

    num_heads: int  # query heads on this rank
    head_size: int
    scale: float  # softmax scale, usually head_size ** -0.5
    num_kv_heads: int
    sliding_window: int | None = None  # attend to at most this many most recent keys (incl. self)
    logits_soft_cap: float | None = None  # tanh soft cap: cap * tanh(s / cap)
    kv_cache_dtype: str = "auto"  # "auto" = model dtype, "fp8" / "fp8_e4m3" / "fp8_e5m2" (the runner sets it)
    attn_type: AttentionType = AttentionType.DECODER


class AttentionImpl(ABC):
    """Per-layer attention computation over the paged KV cache."""

    # whether forward adds the learned sink logit of each head (gpt-oss; :meth:`use_sinks`)
    supports_sinks: ClassVar[bool] = False
    sinks: torch.Tensor | None = None  # (Hq,) float32 or model dtype: one sink logit per query head on this rank

    def __init__(self, spec: AttentionLayerSpec, attention_config: "AttentionConfig | None" = None) -> None:
        self.spec = spec
        self.attention_config = attention_config  # backend options (FA version, FlashInfer flags); None = defaults
        self.num_heads = spec.num_heads
        self.num_kv_heads = spec.num_kv_heads
        self.head_size = spec.head_size
        self.scale = spec.scale
        self.sliding_window = spec.sliding_window
        self.logits_soft_cap = spec.logits_soft_cap
        # per-tensor fp8 scales: the cache stores x / scale (saturated); a 16-bit cache ignores them. Set by the
        # model runner (checkpoint scales) or by calculate_kv_scales on the first prefill; 1.0 otherwise
        self.k_scale = 1.0
        self.v_scale = 1.0
        self.q_scale = 1.0  # backends that quantize the query with a static scale (FLASHINFER)
        self.kv_scales_pending = False  # True: the next forward computes the scales (calculate_kv_scales)

    def set_kv_scales(self, k_scale: float, v_scale: float, q_scale: float | None = None) -> None:
        """Set this layer's fp8 scales (stored value = x / scale). Raises ValueError for a scale that is not a
        positive finite number (:func:`first_bad_kv_scale`)."""
        if bad := first_bad_kv_scale(k_scale, v_scale, q_scale):
            raise ValueError(bad_kv_scale(*bad))
        self.k_scale, self.v_scale = float(k_scale), float(v_scale)
        if q_scale is not None:
            self.q_scale = float(q_scale)

    def calculate_kv_scales(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
        """vLLM's ``calc_kv_scales``: each scale = the absolute maximum of this step's tensor over its constant
        (``K_SCALE_CONSTANT`` ...); an all-zero tensor keeps 1.0. Reads the maxima on the host (one sync, once)."""
        amax = torch.stack([t.abs().amax().float() for t in (query, key, value)]).tolist()
        q, k, v = (
            m / c if m > 0 else 1.0 for m, c in zip(amax, (Q_SCALE_CONSTANT, K_SCALE_CONSTANT, V_SCALE_CONSTANT))
        )
        self.set_kv_scales(k, v, q)
        self.kv_scales_pending = False

    def use_sinks(self, sinks: torch.Tensor) -> None:
        """From now on, each head's softmax also counts ``exp(sinks[h])`` in its denominator (a logit with no
        value: gpt-oss's attention sinks); ``sinks`` (Hq,) is kept by reference (loaded weights fill it later).
        Raises Refused (``attention_backend``) where the backend's kernel has no sink term."""
        if not self.supports_sinks:
            raise Refused(sinks_not_in_kernel(type(self).__name__.removesuffix("Impl")))
        self.sinks = sinks

    @abstractmethod
    def forward(
        self,
        query: torch.Tensor,  # (T, Hq, D) model dtype
        key: torch.Tensor,  # (T, Hkv, D)
        value: torch.Tensor,  # (T, Hkv, D)
        kv_cache: torch.Tensor,  # the backend's get_kv_cache_shape(...)
        metadata: Any,  # this backend's Metadata
        kv_written: bool = False,  # key/value are already in kv_cache (written through kv_write_target)
    ) -> torch.Tensor:  # (T, Hq, D) model dtype
        """Write key/value at ``metadata``'s slot mapping into ``kv_cache`` (unless ``kv_written``), then
        attend. ``key``/``value`` are given either way: a kernel may read this step's K/V from them."""

    def kv_write_target(self, kv_cache: torch.Tensor, metadata: Any) -> "KVWriteTarget | None":
        """Where :meth:`forward` writes this step's key/value: the cache views it reads, the slot mapping,
        the fp8 scales. A caller that stores K/V there itself (with ``write_kv``'s numerics) then calls
        ``forward(..., kv_written=True)``. None (the default): only ``forward`` writes, and it is never
        called with ``kv_written=True``."""
        return None

    def forward_with_rope(
        self,
        query: torch.Tensor,  # (T, Hq, D)
        key: torch.Tensor,  # (T, Hkv, D)
        value: torch.Tensor,  # (T, Hkv, D)
        kv_cache: torch.Tensor,
        metadata: Any,
        rope: "RopeInputs",  # positions (T,), cos/sin tables, optional q/k norm weights
    ) -> torch.Tensor | None:  # (T, Hq, D) model dtype, or None
        """RoPE (after q/k norm) on ``query`` and ``key`` in place, the K/V write and attention, all inside
        the backend's own kernel, for the steps it can do so (``Attention.forward_with_rope``); the same
        values in the cache and the output as ``rope.apply_kv_write`` then ``forward(kv_written=True)``.
        None (the default, and for the steps a backend does not fuse): the caller runs those two instead."""
        return None


class AttentionMetadataBuilder(ABC):
    """Turns the step's common metadata into this backend's kernel arguments, once per step."""

    def __init__(
        self,
        layer_spec: AttentionLayerSpec,
        device: torch.device,
        dtype: torch.dtype,
        attention_config: "AttentionConfig | None" = None,
        kv_cache_layout: KVCacheLayout = KVCacheLayout.NHD,
    ) -> None:
        self.layer_spec = layer_spec
        self.device = device
        self.dtype = dtype
        self.attention_config = attention_config  # backend options; None = defaults
        self.kv_cache_layout = kv_cache_layout  # memory order the runner allocated the cache in

    @abstractmethod
    def build(self, common: CommonAttentionMetadata) -> Any:
        """Return this backend's Metadata for one step."""

    def build_for_cudagraph_capture(self, common: CommonAttentionMetadata) -> Any:
        """Metadata for capturing a pure-decode step of ``common.num_reqs`` requests in a CUDA graph.

        ``common``'s device tensors are the runner's static buffers, which every replay refills in place;
        ``max_seq_len`` is ``max_model_len``, so launch shapes chosen on the host cover any replay. The
        default builds ordinary metadata, right for backends whose metadata holds only those tensors and
        values that stay fixed for a batch size.
        """
        return self.build(common)

    def cudagraph_prologue(self, metadata: Any) -> None:
        """Device work captured at the head of the decode graph, before the forward pass: every replay
        runs it again on the runner's static buffers (FlashInfer rebuilds its page arrays from the static
        ``seq_lens`` and block table here, so replays copy nothing for it).

        ``metadata`` is what :meth:`build_for_cudagraph_capture` returned. It must launch only
        capturable work: fixed shapes, no host synchronisation. The default does nothing.
        """

    @property
    def supports_cascade(self) -> bool:
        """Whether :meth:`build` and :meth:`build_for_cudagraph_capture` take ``common.cascade`` (a shared
        prefix attended separately, ``attention/cascade.py``). False by default."""
        return False

    def prepare_cudagraph_replay(self, metadata: Any, common: CommonAttentionMetadata) -> None:
        """Refresh host-planned state of captured ``metadata`` before a replay (FlashInfer's ``plan()``).

        ``common`` holds this step's values (padded to the captured size), already copied into the static
        buffers; its ``seq_lens_cpu`` and ``block_table_cpu`` are pinned host tensors. Called on every
        replay, so it should do little host work and never synchronise with the device (the host may be
        preparing a step while the device still runs the previous one). The default does nothing.
        """


class AttentionBackend(ABC):
    """Static facts about a backend and factories for its metadata builder and per-layer impl.

    Capability declarations are class attributes so that the selector and the docs generator read them
    without importing any kernel library. ``None`` in a ``supported_*`` attribute means "any". A backend
    whose limits depend on the platform or on the AttentionConfig (FLASH_ATTN's version, FLASHINFER's
    TRT-LLM kernels) overrides :meth:`capabilities` and/or :meth:`extra_reasons`.
    """

    name: ClassVar[str]
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.float16, torch.bfloat16)
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = ("auto",)
    supported_head_sizes: ClassVar[tuple[int, ...] | None] = None
    # head sizes as a rule, used when supported_head_sizes is None: multiple of N within [min, max]
    head_size_multiple_of: ClassVar[int | None] = None
    min_head_size: ClassVar[int | None] = None
    max_head_size: ClassVar[int | None] = None
    # block sizes: either an explicit tuple or a "multiple of" rule
    supported_block_sizes: ClassVar[tuple[int, ...] | None] = None
    block_size_multiple_of: ClassVar[int | None] = None
    min_compute_capability: ClassVar[tuple[int, int] | None] = None
    max_compute_capability: ClassVar[tuple[int, int] | None] = None  # inclusive major.minor
    supports_sliding_window: ClassVar[bool] = False
    supports_logits_soft_cap: ClassVar[bool] = False
    supports_sinks: ClassVar[bool] = False
    supported_attn_types: ClassVar[tuple[AttentionType, ...]] = (AttentionType.DECODER,)
    device_types: ClassVar[tuple[str, ...]] = ("cuda",)
    required_package: ClassVar[str | None] = None  # importable module name ("flash_attn.cute" allowed)
    pip_extra: ClassVar[str | None] = None  # attnserve[<extra>] that brings it
    install_hint: ClassVar[str | None] = None  # shown instead of the pip-extra hint when set
    required_kv_cache_layout: ClassVar[KVCacheLayout | None] = None
    cuda_graph_support: ClassVar[CudaGraphSupport] = CudaGraphSupport.NEVER

    @staticmethod
    @abstractmethod
    def get_impl_cls() -> type[AttentionImpl]: ...

    @staticmethod
    @abstractmethod
    def get_builder_cls() -> type[AttentionMetadataBuilder]: ...

    @classmethod
    def get_kv_cache_shape(cls, num_blocks: int, block_size: int, num_kv_heads: int, head_size: int) -> tuple[int, ...]:
        """Logical KV-cache shape of one layer: ``(2, num_blocks, block_size, num_kv_heads, head_size)``.

        Index 0 of the first dim holds keys, 1 values. The NHD layout is the logical one for every backend;
        :meth:`get_kv_cache_stride_order` gives the physical order.
        """
        return (2, num_blocks, block_size, num_kv_heads, head_size)

    @classmethod
    def get_kv_cache_stride_order(cls, layout: KVCacheLayout = KVCacheLayout.NHD) -> tuple[int, ...]:
        """Permutation from the logical shape to the physical memory order for ``layout``.

        ``torch.empty(shape permuted by order).permute(inverse(order))`` gives a tensor with the logical
        shape whose memory follows ``layout``. Backends with another logical shape override this.
        """
        if layout == KVCacheLayout.HND:
            return (0, 1, 3, 2, 4)
        return (0, 1, 2, 3, 4)

    @classmethod
    def capabilities(
        cls,
        platform: "Platform | None" = None,
        attention_config: "AttentionConfig | None" = None,
        assume_installed: bool = False,
    ) -> "BackendCapabilities":
        """The declared limits as one typed record (what validation and the docs read)."""
        from attnserve.attention.capabilities import BackendCapabilities

        return BackendCapabilities.from_backend(cls)

    @classmethod
    def compile_ahead(
        cls,
        layer_specs: list[AttentionLayerSpec],
        device: torch.device,
        dtype: torch.dtype,
        attention_config: "AttentionConfig | None" = None,
    ) -> None:
        """Start compiling, in the background, the JIT kernels these layers will need, before the weights load
        (FLASHINFER); the builder's first plan waits for them. Nothing by default. Must never raise."""

    @classmethod
    def extra_reasons(
        cls,
        selector_config: "AttentionSelectorConfig",
        platform: "Platform",
        attention_config: "AttentionConfig | None" = None,
    ) -> list["Reason"]:
        """Backend-specific reasons beyond the declared limits (e.g. a flag that needs another GPU)."""
        return []

    @classmethod
    def get_required_kv_cache_layout(
        cls, platform: "Platform | None" = None, attention_config: "AttentionConfig | None" = None
    ) -> KVCacheLayout | None:
        """The KV layout this backend's kernels need on ``platform``, or None when either works."""
        return cls.required_kv_cache_layout

    @classmethod
    def validate(
        cls,
        selector_config: "AttentionSelectorConfig",
        platform: "Platform",
        attention_config: "AttentionConfig | None" = None,
        assume_installed: bool = False,
    ) -> list["Reason"]:
        """Reasons this backend cannot run ``selector_config`` on ``platform``; empty when it can.

        ``assume_installed`` skips the package check (planning for another machine).
        """
        from attnserve.attention.validation import capability_reasons

        caps = cls.capabilities(platform, attention_config, assume_installed)
        reasons = capability_reasons(caps, selector_config, platform, assume_installed=assume_installed)
        return reasons + cls.extra_reasons(selector_config, platform, attention_config)
