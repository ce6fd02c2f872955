"""FLASHINFER: FlashInfer's paged-KV prefill/decode kernels. Declarations only (kernels: issue 6).

Limits (FlashInfer docs and the kernels' dispatch tables, as vLLM declares them):
* GPUs: SM75 (Turing) through Blackwell: compute capability 7.5 to 12.1.
* head sizes 64, 128, 256 (``DISPATCH_HEAD_DIM`` in include/flashinfer/utils.cuh).
* page (block) sizes 16, 32, 64: the sizes the TRT-LLM-generated kernels on Blackwell accept; vLLM uses
  the same list on every GPU.
* fp8 KV cache (e4m3 and e5m2); dtypes float16 and bfloat16.
* sliding window and logits soft cap: yes. Attention sinks: only through the TRT-LLM kernels (CC 10.x).
* On CC 10.x the TRT-LLM kernels need the HND layout, so the backend requires it there.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from attnserve.attention.backend import AttentionBackend, AttentionType, CudaGraphSupport, KVCacheLayout
from attnserve.attention.capabilities import BackendCapabilities


def _trtllm_applies(platform, attention_config) -> bool:
    """TRT-LLM kernels run on CC 10.x unless the user turned them off (use_trtllm_attention=False)."""
    on_blackwell = platform is not None and platform.compute_capability is not None \
        and platform.compute_capability[0] == 10
    flag = attention_config.use_trtllm_attention if attention_config is not None else None
    return on_blackwell and flag is not False


class FlashInferBackend(AttentionBackend):
    name: ClassVar[str] = "FLASHINFER"
    supported_dtypes = (torch.float16, torch.bfloat16)
    supported_kv_cache_dtypes = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
    supported_head_sizes = (64, 128, 256)
    supported_block_sizes = (16, 32, 64)
    min_compute_capability = (7, 5)
    max_compute_capability = (12, 1)
    supports_sliding_window = True
    supports_logits_soft_cap = True
    supports_sinks = True  # TRT-LLM kernels only (CC 10.x); see capabilities()
    supported_attn_types = (AttentionType.DECODER,)
    device_types = ("cuda",)
    required_package = "flashinfer"
    pip_extra = "flashinfer"
    required_kv_cache_layout = None  # HND on CC 10.x; see get_required_kv_cache_layout()
    cuda_graph_support = CudaGraphSupport.UNIFORM_SINGLE_TOKEN_DECODE

    @staticmethod
    def get_impl_cls():
        raise NotImplementedError("kernels: issue 6")

    @staticmethod
    def get_builder_cls():
        raise NotImplementedError("kernels: issue 6")

    @classmethod
    def get_kv_cache_shape(cls, num_blocks: int, block_size: int, num_kv_heads: int, head_size: int) -> tuple[int, ...]:
        """``(num_blocks, 2, block_size, num_kv_heads, head_size)``: K and V of a block sit together, as
        FlashInfer's paged-KV wrappers take them."""
        return (num_blocks, 2, block_size, num_kv_heads, head_size)

    @classmethod
    def capabilities(cls, platform=None, attention_config=None, assume_installed=False) -> BackendCapabilities:
        if platform is None:
            return BackendCapabilities.from_backend(cls)
        trtllm = _trtllm_applies(platform, attention_config)
        return BackendCapabilities.from_backend(
            cls, sinks=trtllm, required_kv_cache_layout=KVCacheLayout.HND if trtllm else None,
            cuda_graph_support=CudaGraphSupport.UNIFORM_BATCH if trtllm else cls.cuda_graph_support,
        )

    @classmethod
    def extra_reasons(cls, selector_config, platform, attention_config=None) -> list[str]:
        reasons = []
        cc = platform.compute_capability
        if attention_config is not None and attention_config.use_trtllm_attention is True and \
                (cc is None or cc[0] != 10):
            where = f"{cc[0]}.{cc[1]}" if cc else "unknown"
            reasons.append(f"use_trtllm_attention=True needs compute capability 10.x (this device: {where})")
        if selector_config.has_sink and not _trtllm_applies(platform, attention_config):
            # replace the generic "attention sinks not supported" with the way to get them
            reasons.append("attention sinks need FlashInfer's TRT-LLM kernels (compute capability 10.x)")
        return reasons

    @classmethod
    def validate(cls, selector_config, platform, attention_config=None, assume_installed=False) -> list[str]:
        reasons = super().validate(selector_config, platform, attention_config, assume_installed)
        return [r for r in reasons if r != "attention sinks not supported"]

    @classmethod
    def get_required_kv_cache_layout(cls, platform=None, attention_config=None) -> KVCacheLayout | None:
        return KVCacheLayout.HND if _trtllm_applies(platform, attention_config) else None
