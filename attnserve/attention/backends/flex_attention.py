"""FLEX_ATTENTION: torch's ``flex_attention`` with a paged block mask. Declarations only (kernels: issue 6).

Limits: CUDA and CPU; any head size and block size; float32, float16, bfloat16; KV cache in the model
dtype only (no fp8); sliding window through the mask; no logits soft cap and no sinks (vLLM's FlexAttention
rejects both); no CUDA graphs. Needs ``torch.nn.attention.flex_attention`` (torch >= 2.5); on CUDA,
torch.compile generates its kernels with Triton, so Triton is needed there too.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from attnserve.attention.backend import AttentionBackend, AttentionType, CudaGraphSupport
from attnserve.attention.validation import package_installed


class FlexAttentionBackend(AttentionBackend):
    name: ClassVar[str] = "FLEX_ATTENTION"
    supported_dtypes = (torch.float16, torch.bfloat16, torch.float32)
    supported_kv_cache_dtypes = ("auto",)
    supports_sliding_window = True
    supports_logits_soft_cap = False
    supports_sinks = False
    supported_attn_types = (AttentionType.DECODER, AttentionType.ENCODER_ONLY)
    device_types = ("cuda", "cpu")
    required_package = "torch.nn.attention.flex_attention"
    install_hint = "pip install 'torch>=2.5'"
    cuda_graph_support = CudaGraphSupport.NEVER

    @staticmethod
    def get_impl_cls():
        raise NotImplementedError("kernels: issue 6")

    @staticmethod
    def get_builder_cls():
        raise NotImplementedError("kernels: issue 6")

    @classmethod
    def validate(cls, selector_config, platform, attention_config=None, assume_installed=False) -> list[str]:
        reasons = super().validate(selector_config, platform, attention_config, assume_installed)
        if platform.device_type == "cuda" and not assume_installed and not package_installed("triton"):
            reasons.append("not installed: pip install 'attnserve[triton]' (flex_attention compiles with Triton on CUDA)")
        return reasons
