"""Attention backend selection: explicit choice validated, or the platform's priority list walked (§4).

    selection = select_attn_backend(None, AttentionSelectorConfig(head_size=128, dtype=torch.bfloat16),
                                    detect_platform("cuda:9.0"), assume_installed=True)
    selection.name, selection.backend_cls, selection.kv_cache_layout, selection.flash_attn_version

``get_attn_backend`` returns only the class. Both raise NoUsableBackendError (a ValueError) with every
reason, the device and the backends that would work. Results are cached per (backend, selector config,
platform, attention config, assume_installed, requested layout); ``register_backend`` clears the cache.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from attnserve.attention.backend import AttentionBackend, AttentionType, KVCacheLayout
from attnserve.attention.capabilities import dtype_name
from attnserve.attention.registry import (
    AttentionBackendEnum,
    BackendName,
    backend_name,
    get_backend_class,
    on_registry_change,
)
from attnserve.config.attention import AttentionConfig
from attnserve.config.cache import CacheConfig
from attnserve.platforms.interface import Platform
from attnserve.refusals import Reason, Refusal, Refused
from attnserve.refusals.backends import cannot_be_loaded, cannot_run, layout_conflict, no_backend

logger = logging.getLogger(__name__)


class NoUsableBackendError(Refused):
    """No backend (or not the explicitly chosen one) can run the model; the message has every reason.

    ``key`` is the setting to change, for the CLI to name the flag that gave it: ``attention_config.backend``
    when the backend was chosen explicitly; when automatic selection found none, the setting (``kv_cache_dtype``,
    ``block_size`` or ``attention_config.FIELD``) that alone keeps the most preferred backend from running, else None.
    ``reasons``: each backend's :class:`~attnserve.refusals.Reason` records.
    """

    __reduce__ = Refused.reduce_from_record

    def __init__(self, refusal: Refusal, reasons: dict[str, list[Reason]] | None = None) -> None:
        super().__init__(refusal)
        self.reasons = reasons or {}


class KVCacheLayoutConflictError(ValueError):
    """The user's KV-cache layout differs from the one the selected backend requires."""


@dataclass(frozen=True)
class AttentionSelectorConfig:
    """What a backend must support to run a model's attention layers."""

    head_size: int
    dtype: torch.dtype
    kv_cache_dtype: str = "auto"  # "auto" = model dtype, "fp8" / "fp8_e4m3" / "fp8_e5m2"
    block_size: int = 16  # tokens per KV-cache block
    sliding_window: int | None = None  # tokens; None = full attention
    logits_soft_cap: float | None = None
    has_sink: bool = False
    attn_type: AttentionType = AttentionType.DECODER
    # heads of one tensor-parallel rank (None: not known); every rank is handed the same values, so that
    # selection, which sees only this record, picks the same backend on every rank
    num_heads: int | None = None
    num_kv_heads: int | None = None

    def describe(self) -> str:
        """E.g. ``head_size 80, dtype bfloat16, kv_cache_dtype auto, block_size 16``."""
        parts = [
            f"head_size {self.head_size}",
            f"dtype {dtype_name(self.dtype)}",
            f"kv_cache_dtype {self.kv_cache_dtype}",
            f"block_size {self.block_size}",
        ]
        if self.sliding_window is not None:
            parts.append(f"sliding_window {self.sliding_window}")
        if self.logits_soft_cap is not None:
            parts.append(f"logits_soft_cap {self.logits_soft_cap}")
        if self.has_sink:
            parts.append("attention sinks")
        if self.attn_type != AttentionType.DECODER:
            parts.append(f"attention type {self.attn_type.value}")
        if self.num_heads is not None:
            parts.append(f"{self.num_heads} query / {self.num_kv_heads} KV heads per rank")
        return ", ".join(parts)

    def to_dict(self) -> dict:
        heads = {} if self.num_heads is None else {"num_heads": self.num_heads, "num_kv_heads": self.num_kv_heads}
        return {
            "head_size": self.head_size,
            "dtype": dtype_name(self.dtype),
            "kv_cache_dtype": self.kv_cache_dtype,
            "block_size": self.block_size,
            "sliding_window": self.sliding_window,
            "logits_soft_cap": self.logits_soft_cap,
            "has_sink": self.has_sink,
            "attn_type": self.attn_type.value,
            **heads,
        }


@dataclass(frozen=True)
class AttentionSelection:
    """The outcome of selection: which backend, with which KV layout (and FlashAttention version)."""

    name: str  # "FLASH_ATTN", or a registered out-of-tree name
    backend: BackendName
    backend_cls: type[AttentionBackend]
    kv_cache_layout: KVCacheLayout
    flash_attn_version: int | None = None  # FLASH_ATTN only: the version that will run
    explicit: bool = False
    # automatic selection: the reasons of every backend tried before (and including) the winner
    reasons: dict[str, list[str]] = field(default_factory=dict)


def backend_reasons(
    backend: BackendName,
    selector_config: AttentionSelectorConfig,
    platform: Platform,
    attention_config: AttentionConfig | None = None,
    assume_installed: bool = False,
) -> tuple[type[AttentionBackend] | None, list[str]]:
    """Import ``backend``'s class and return it with its reasons (a module that fails to import is a reason)."""
    try:
        cls = get_backend_class(backend)
    except (ImportError, ValueError) as e:
        return None, [cannot_be_loaded(backend_name(backend), e)]
    return cls, cls.validate(selector_config, platform, attention_config, assume_installed)


def negotiate_kv_cache_layout(
    name: str, required: KVCacheLayout | None, requested: KVCacheLayout | None
) -> KVCacheLayout:
    """The layout to allocate: the backend's required one, else the user's, else NHD.

    Raises KVCacheLayoutConflictError when the user asked for a layout the backend cannot use.
    """
    if required is not None and requested is not None and required != requested:
        raise KVCacheLayoutConflictError(layout_conflict(requested.value, name, required.value))
    return required or requested or KVCacheLayout.NHD


_CACHE: dict[tuple, AttentionSelection] = {}


def clear_backend_cache() -> None:
    """Forget cached selections (called on every register_backend)."""
    _CACHE.clear()


on_registry_change(clear_backend_cache)


def select_attn_backend(
    backend: "BackendName | AttentionConfig | None",
    selector_config: AttentionSelectorConfig,
    platform: Platform,
    attention_config: AttentionConfig | None = None,
    *,
    assume_installed: bool = False,
    kv_cache_layout: KVCacheLayout | None = None,
) -> AttentionSelection:
    """Choose the attention backend. ``backend`` is a member, a registered name, None (automatic) or an
    AttentionConfig (its ``backend`` field, and its options). ``kv_cache_layout`` is the user's explicit
    layout, if any. Raises NoUsableBackendError or KVCacheLayoutConflictError.
    """
    if isinstance(backend, AttentionConfig):
        attention_config, backend = backend, backend.backend
    key = (
        backend_name(backend) if backend is not None else None,
        selector_config,
        platform,
        attention_config,
        assume_installed,
        kv_cache_layout,
    )
    if key not in _CACHE:
        if backend is not None:
            selection = _select_explicit(backend, selector_config, platform, attention_config, assume_installed)
        else:
            selection = _select_automatic(selector_config, platform, attention_config, assume_installed)
        layout = negotiate_kv_cache_layout(
            selection.name,
            selection.backend_cls.get_required_kv_cache_layout(platform, attention_config),
            kv_cache_layout,
        )
        version = None
        if selection.name == AttentionBackendEnum.FLASH_ATTN.name and hasattr(selection.backend_cls, "resolve_version"):
            version = selection.backend_cls.resolve_version(
                selector_config, platform, attention_config, assume_installed
            )
        _CACHE[key] = AttentionSelection(
            selection.name,
            selection.backend,
            selection.backend_cls,
            layout,
            version,
            selection.explicit,
            selection.reasons,
        )
    return _CACHE[key]


def get_attn_backend(
    backend: "BackendName | AttentionConfig | None",
    selector_config: AttentionSelectorConfig,
    platform: Platform,
    attention_config: AttentionConfig | None = None,
    *,
    assume_installed: bool = False,
    kv_cache_layout: KVCacheLayout | None = None,
) -> type[AttentionBackend]:
    """Return the backend class to use (see :func:`select_attn_backend`)."""
    return select_attn_backend(
        backend,
        selector_config,
        platform,
        attention_config,
        assume_installed=assume_installed,
        kv_cache_layout=kv_cache_layout,
    ).backend_cls


def evaluate_backends(
    selector_config: AttentionSelectorConfig,
    platform: Platform,
    attention_config: AttentionConfig | None = None,
    assume_installed: bool = False,
    backends: "list[BackendName] | None" = None,
) -> dict[str, list[str]]:
    """Reasons of each backend (default: the platform's priority list), in order; [] = usable."""
    members = platform.backend_priorities() if backends is None else backends
    return {
        backend_name(m): backend_reasons(m, selector_config, platform, attention_config, assume_installed)[1]
        for m in members
    }


def _select_explicit(backend, selector_config, platform, attention_config, assume_installed) -> AttentionSelection:
    name = backend_name(backend)
    cls, reasons = backend_reasons(backend, selector_config, platform, attention_config, assume_installed)
    if reasons:
        working = [
            n
            for n, r in evaluate_backends(selector_config, platform, attention_config, assume_installed).items()
            if not r and n != name
        ]
        raise NoUsableBackendError(
            cannot_run(name, selector_config.describe(), platform.description, reasons, working), {name: reasons}
        )
    logger.info("Using %s attention backend (explicitly chosen)", name)
    return AttentionSelection(name, backend, cls, KVCacheLayout.NHD, explicit=True)


def _select_automatic(selector_config, platform, attention_config, assume_installed) -> AttentionSelection:
    priorities = platform.backend_priorities()
    tried: dict[str, list[str]] = {}
    for member in priorities:
        cls, reasons = backend_reasons(member, selector_config, platform, attention_config, assume_installed)
        tried[member.name] = reasons
        if not reasons:
            logger.info(
                "Using %s attention backend out of potential backends: %s", member.name, [m.name for m in priorities]
            )
            for other, why in tried.items():
                if why:
                    logger.debug("attention backend %s skipped: %s", other, "; ".join(why))
            return AttentionSelection(member.name, member, cls, KVCacheLayout.NHD, reasons=tried)
    raise NoUsableBackendError(
        no_backend(
            selector_config.describe(),
            platform.description,
            tried,
            _responsible_setting(selector_config, tried, attention_config),
        ),
        tried,
    )


def _responsible_setting(
    selector_config: AttentionSelectorConfig,
    tried: dict[str, list[Reason]],
    attention_config: AttentionConfig | None = None,
) -> str | None:
    """The setting, set away from its default, that alone keeps the most preferred backend it can keep from running
    (``tried`` is in priority order) from running: the first backend whose reasons all name one field that the user
    sets, a KV-cache one (``kv_cache_dtype``, ``block_size``) or an attention_config one (then
    ``attention_config.FIELD``, e.g. ``attention_config.use_prefill_decode_attention``). None when no backend is kept
    from running by one such setting alone (the model, the device or a package is to blame)."""
    for reasons in tried.values():
        fields = {r.field if isinstance(r, Reason) else None for r in reasons}
        if not reasons or len(fields) != 1:
            continue
        name = fields.pop()
        if name in ("kv_cache_dtype", "block_size"):
            if getattr(selector_config, name) != CacheConfig.__dataclass_fields__[name].default:
                return name
        elif attention_config is not None and name in AttentionConfig.field_names() and name != "backend":
            if getattr(attention_config, name) != AttentionConfig.__dataclass_fields__[name].default:
                return f"attention_config.{name}"
    return None
