"""AttentionConfig: which attention backend runs, and its options (design: attention-system.md §1)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from attnserve.attention.registry import (
    AttentionBackendEnum,
    BackendName,
    UnknownBackendError,
    backend_name,
    lookup_backend,
    registered_names,
)
from attnserve.config.fields import ConfigError, refuses_unknown_keywords, setting_path, validate_fields
from attnserve.refusals import Refusal, closest, kind_of
from attnserve.refusals.config import A_BACKEND_NAME, A_MAPPING_OF_FIELDS, backend_names_words, unknown_attention_field

logger = logging.getLogger(__name__)

__all__ = ["AttentionConfig", "ConfigError", "parse_backend"]


def parse_backend(value: "str | BackendName | None", key: str = "attention_config.backend") -> BackendName | None:
    """Parse a backend name case-insensitively (``-`` = ``_``); None, '' and 'auto' mean automatic selection.

    Returns the AttentionBackendEnum member, or the name of an out-of-tree backend added with
    ``register_backend("MY_ATTN", ...)`` or an ``attnserve.attention_backends`` entry point (looked up
    through the registry; nothing is imported). Raises ConfigError naming the value, the valid names and
    the closest one.
    """
    if value is None or isinstance(value, AttentionBackendEnum):
        return value
    valid = [m.name for m in AttentionBackendEnum]
    if not isinstance(value, str):
        raise ConfigError(
            Refusal(
                setting_path(key),
                value,
                backend_names_words(valid, null=True),
                kind=kind_of(value),
                noun=A_BACKEND_NAME,
            )
        )
    name = value.strip().upper().replace("-", "_")
    if name in ("", "AUTO"):
        return None
    if name in AttentionBackendEnum.__members__:
        return AttentionBackendEnum[name]
    try:
        return lookup_backend(name)  # a registered out-of-tree name
    except UnknownBackendError:
        pass
    valid += [n for n in registered_names() if n not in valid]
    # an abbreviation or expansion ("FLASH_ATTENTION" -> FLASH_ATTN, "TRITON" -> TRITON_ATTN) beats
    # spelling distance, which would suggest FLEX_ATTENTION for "FLASH_ATTENTION"
    near = [v for v in valid if _subsequence(v, name) or _subsequence(name, v)]
    raise ConfigError(
        Refusal(
            setting_path(key),
            value,
            backend_names_words(valid),
            suggestion=near[0] if len(near) == 1 else closest(name, valid),
        )
    )


def _subsequence(short: str, long: str) -> bool:
    it = iter(long)
    return all(c in it for c in short)


def _only(*backends: str) -> dict:
    """Field metadata: the option applies to these backends only."""
    return {"backends": backends}


def _unknown_keyword(key: object, valid: list[str], suggestion: str | None) -> Refusal:
    """``AttentionConfig(foo=1)``: refused as an unknown attention_config key of a file or ``-ac`` is."""
    return unknown_attention_field(key, valid, "", suggestion, str(key).replace("-", "_"))


@refuses_unknown_keywords(_unknown_keyword)
@dataclass(frozen=True)
class AttentionConfig:
    """Attention backend selection and per-backend options. Validated at construction; unknown fields are errors."""

    backend: AttentionBackendEnum | str | None = None
    """Attention backend: FLASH_ATTN, FLASHINFER, TRITON_ATTN, FLEX_ATTENTION, CPU_ATTN, CUSTOM or the
    name of a registered out-of-tree backend (case-insensitive); unset (None in Python, null in a file) or "auto"
    = the first backend of the platform's priority list that supports the model."""

    flash_attn_version: int | None = field(default=None, metadata={"choices": (2, 3, 4), **_only("FLASH_ATTN")})
    """FLASH_ATTN only: FlashAttention version 2, 3 or 4; None = the best version that is installed and
    supports this GPU. A version that is not installed or does not support the GPU is an error."""

    use_prefill_decode_attention: bool = False
    """Run each step's prefill tokens and decode tokens through separate kernels (varlen prefill, then
    paged decode) instead of one unified call over the mixed batch. Refused by CPU_ATTN and TRITON_ATTN, which
    always run them apart."""

    flash_attn_max_num_splits_for_cuda_graph: int = field(
        default=32, metadata={"ge": 1, "le": 256, **_only("FLASH_ATTN")}
    )
    """FLASH_ATTN only (version 3): upper bound on split-KV splits of a request when decode runs under CUDA graphs
    (FlashAttention 3's plan, made inside the graph, splits each request up to this many times); 1 to 256 (FA3's
    combine kernel takes at most 256 splits). FlashAttention 2 and 4 have no split plan: the selector refuses a
    value other than the default with them."""

    use_trtllm_attention: bool | None = field(default=None, metadata=_only("FLASHINFER"))
    """FLASHINFER only: vLLM's switch for FlashInfer's TRT-LLM kernels (Blackwell, CC 10.x), which attnserve does not
    wire: None and false run FlashInfer's own kernels on every GPU; true is refused (on CC 10.x: not wired; on
    another GPU: the kernels need CC 10.x)."""

    disable_flashinfer_prefill: bool = field(default=False, metadata=_only("FLASHINFER"))
    """FLASHINFER only: prefill tokens use the fallback prefill kernel (FlashAttention if installed, else
    Triton) while decode stays on FlashInfer."""

    disable_flashinfer_q_quantization: bool = field(default=False, metadata=_only("FLASHINFER"))
    """FLASHINFER only, fp8 KV cache: keep the query in the model dtype instead of quantizing it to fp8."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "backend", parse_backend(self.backend))
        validate_fields(self, prefix="attention_config.")

    @classmethod
    def field_names(cls) -> list[str]:
        """The valid field names, in declaration order."""
        return [f.name for f in fields(cls)]

    @classmethod
    def normalize_key(cls, key: object, where: str = "") -> str:
        """Map a user's field name (``-`` or ``_``) to the field; unknown names raise with a suggestion.

        ``where`` completes the error message, e.g. ``"in cfg.yaml"``; with it, a key that is not text is shown
        as the file writes it (``true``).
        """
        valid = cls.field_names()
        name = str(key).replace("-", "_")
        if name not in valid:
            raise ConfigError(unknown_attention_field(key, valid, where, closest(name, valid), name))
        return name

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> AttentionConfig:
        """Build from a mapping; keys may use '-' or '_'. Unknown keys raise ConfigError with a suggestion."""
        if not isinstance(values, Mapping):
            raise ConfigError(Refusal(("attention_config",), values, noun=A_MAPPING_OF_FIELDS))
        return cls(**{cls.normalize_key(k): v for k, v in values.items()})

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields; the backend as its name (None = auto)."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["backend"] = backend_name(self.backend) if self.backend is not None else None
        return d

    def unused_options(self, selected: BackendName | None = None) -> list[str]:
        """Options set away from their default that do not apply to the explicitly chosen backend, or to
        ``selected`` (the backend automatic selection picked) when given."""
        backend = selected if selected is not None else self.backend
        if backend is None:
            return []
        return [
            f.name
            for f in fields(self)
            if "backends" in f.metadata
            and backend_name(backend) not in f.metadata["backends"]
            and getattr(self, f.name) != f.default
        ]
