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

_warned: set[str] = set()


def warn_ignored_vllm_env() -> None:
    """Log one warning per set vLLM attention variable (once per process), naming the flag to use."""
    for name, flag in VLLM_ATTENTION_ENV.items():
        value = os.environ.get(name)
        if value is not None and name not in _warned:
            _warned.add(name)
            logger.warning(
                "%s=%s is ignored by attnserve; use %s %s (Python: the attention_backend / attention_config arguments)",
                name,
                value,
                flag,
                value,
            )
