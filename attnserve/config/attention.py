"""AttentionConfig: which attention backend runs, and its options (design: attention-system.md §1)."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, fields

from attnserve.attention.registry import AttentionBackendEnum


class ConfigError(ValueError):
    """A configuration value or key that is not allowed; the message names it and what is allowed."""


def _closest(name: str, choices: list[str]) -> str:
    match = difflib.get_close_matches(name, choices, n=1)
    return f"; did you mean {match[0]!r}?" if match else ""


def parse_backend(value: "str | AttentionBackendEnum | None") -> AttentionBackendEnum | None:
    """Parse a backend name case-insensitively; None, '' and 'auto' mean automatic selection.

    Raises ConfigError naming the value, the valid names and the closest one.
    """
    if value is None or isinstance(value, AttentionBackendEnum):
        return value
    if not isinstance(value, str):
        raise ConfigError(f"attention backend must be a string, got {value!r}")
    name = value.strip().upper().replace("-", "_")
    if name in ("", "AUTO"):
        return None
    try:
        return AttentionBackendEnum[name]
    except KeyError:
        valid = [m.name for m in AttentionBackendEnum]
        raise ConfigError(
            f"unknown attention backend {value!r} (valid: {', '.join(valid)}, auto)" + _closest(name, valid)
        ) from None


@dataclass(frozen=True)
class AttentionConfig:
    """Attention backend selection and per-backend options. Validated at construction."""

    backend: AttentionBackendEnum | None = None
    """Attention backend to use; None or "auto" selects the first backend of the platform's priority
    list that supports the model. Names are case-insensitive."""

    flash_attn_version: int | None = None
    """FLASH_ATTN only: FlashAttention version 2, 3 or 4; None = the best installed version for this GPU."""

    use_prefill_decode_attention: bool = False
    """Run prefill and decode tokens through separate kernels instead of one unified call."""

    flash_attn_max_num_splits_for_cuda_graph: int = 32
    """Upper bound on FlashAttention split-KV splits for decode under CUDA graphs."""

    use_trtllm_attention: bool | None = None
    """FLASHINFER only: use FlashInfer's TRT-LLM kernels (CC 10.x); None = where they apply."""

    disable_flashinfer_prefill: bool = False
    """FLASHINFER only: prefill tokens use the fallback prefill kernel; decode stays on FlashInfer."""

    disable_flashinfer_q_quantization: bool = False
    """FLASHINFER only, fp8 KV cache: keep the query in the model dtype instead of fp8."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "backend", parse_backend(self.backend))
        if self.flash_attn_version not in (None, 2, 3, 4) or isinstance(self.flash_attn_version, bool):
            raise ConfigError(
                f"attention_config.flash_attn_version {self.flash_attn_version!r} not allowed (allowed: 2, 3, 4, null)"
            )
        for f in ("use_prefill_decode_attention", "disable_flashinfer_prefill", "disable_flashinfer_q_quantization"):
            if not isinstance(getattr(self, f), bool):
                raise ConfigError(f"attention_config.{f} {getattr(self, f)!r} not allowed (allowed: true, false)")
        if self.use_trtllm_attention not in (None, True, False):
            raise ConfigError(
                f"attention_config.use_trtllm_attention {self.use_trtllm_attention!r} not allowed (allowed: true, false, null)"
            )
        n = self.flash_attn_max_num_splits_for_cuda_graph
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(
                f"attention_config.flash_attn_max_num_splits_for_cuda_graph {n!r} not allowed (allowed: integer >= 1)"
            )

    @classmethod
    def from_dict(cls, values: dict) -> "AttentionConfig":
        """Build from a mapping; keys may use '-' or '_'. Unknown keys raise ConfigError with a suggestion."""
        valid = [f.name for f in fields(cls)]
        kwargs = {}
        for key, value in values.items():
            name = str(key).replace("-", "_")
            if name not in valid:
                raise ConfigError(
                    f"unknown attention_config field {key!r} (valid: {', '.join(valid)})" + _closest(name, valid)
                )
            kwargs[name] = value
        return cls(**kwargs)
