"""vLLM's attention environment variables: not configuration here, but warned about once when set.

A user migrating from vLLM may still export them; attnserve ignores them (environment variables are not
configuration) and says so once per variable, with the flag to use instead.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)

# vLLM variable -> the attnserve flag that replaces it
VLLM_ATTENTION_ENV = {
    "VLLM_ATTENTION_BACKEND": "--attention-backend",
    "VLLM_FLASH_ATTN_VERSION": "--attention-config.flash_attn_version",
    "VLLM_V1_USE_PREFILL_DECODE_ATTENTION": "--attention-config.use_prefill_decode_attention",
    "VLLM_FLASH_ATTN_MAX_NUM_SPLITS_FOR_CUDA_GRAPH": "--attention-config.flash_attn_max_num_splits_for_cuda_graph",
    "VLLM_USE_TRTLLM_ATTENTION": "--attention-config.use_trtllm_attention",
    "VLLM_DISABLE_FLASHINFER_PREFILL": "--attention-config.disable_flashinfer_prefill",
    "VLLM_FLASHINFER_DISABLE_Q_QUANTIZATION": "--attention-config.disable_flashinfer_q_quantization",
}

# vLLM's boolean variables take 1/0 (and true/false); the flags take JSON's true/false, and refuse 1
_BOOLEAN_SPELLINGS = {"1": "true", "true": "true", "0": "false", "false": "false"}

_warned: set[str] = set()


def _is_boolean(flag: str) -> bool:
    """Whether the attention field that ``flag`` sets is a boolean (``--attention-config.use_trtllm_attention``)."""
    from attnserve.config.attention import AttentionConfig
    from attnserve.config.fields import field_types, split_optional

    if not flag.startswith("--attention-config."):
        return False
    return split_optional(field_types(AttentionConfig)[flag.split(".", 1)[1]])[0] is bool


def flag_value(flag: str, value: str) -> str:
    """``value`` of a vLLM variable as ``flag`` takes it: a boolean's ``1`` / ``0`` as ``true`` / ``false`` (``1``
    is refused as an integer); a boolean's other text as ``true|false``; anything else as it is."""
    if not _is_boolean(flag):
        return value
    return _BOOLEAN_SPELLINGS.get(value.strip().lower(), "true|false")


def ignored_vllm_env(environ: "os._Environ[str] | dict[str, str]") -> dict[str, tuple[str, str, str]]:
    """vLLM variable -> (its value, the flag to use, the flag's value) for each vLLM attention variable set in
    ``environ``. An empty value is unset, as vLLM reads it."""
    out = {}
    for name, flag in VLLM_ATTENTION_ENV.items():
        value = environ.get(name)
        if value is not None and value.strip():
            out[name] = (value, flag, flag_value(flag, value))
    return out


def warn_ignored_vllm_env() -> None:
    """Log one warning per set vLLM attention variable (once per process), naming the flag to use."""
    for name, (value, flag, given) in ignored_vllm_env(os.environ).items():
        if name not in _warned:
            _warned.add(name)
            logger.warning(
                "%s=%s is ignored by attnserve; use %s %s (Python: the attention_backend / attention_config arguments)",
                name,
                value,
                flag,
                given,
            )
