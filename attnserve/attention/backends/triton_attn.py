"""TRITON_ATTN: a unified paged-attention kernel written in Triton. Declarations only (kernels: issue 6).

Limits: any CUDA GPU Triton compiles for (compute capability >= 7.0, the minimum of Triton's NVIDIA
backend and of torch.compile's GPU path); float32 as well as float16/bfloat16; head sizes >= 32 (the
kernel pads to the next power of two); block sizes multiples of 16; fp8 KV cache; sliding window, logits
soft cap and sinks; runs whole mixed batches, so CUDA graphs can capture any step.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from attnserve.attention.backend import AttentionBackend, AttentionType, CudaGraphSupport


class TritonAttentionBackend(AttentionBackend):
    name: ClassVar[str] = "TRITON_ATTN"
    supported_dtypes = (torch.float16, torch.bfloat16, torch.float32)
    supported_kv_cache_dtypes = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
    min_head_size = 32
    block_size_multiple_of = 16
    min_compute_capability = (7, 0)
    supports_sliding_window = True
    supports_logits_soft_cap = True
    supports_sinks = True
    supported_attn_types = (AttentionType.DECODER,)
    device_types = ("cuda",)
    required_package = "triton"
    pip_extra = "triton"
    cuda_graph_support = CudaGraphSupport.ALWAYS

    @staticmethod
    def get_impl_cls():
        raise NotImplementedError("kernels: issue 6")

    @staticmethod
    def get_builder_cls():
        raise NotImplementedError("kernels: issue 6")

    @classmethod
    def get_kv_cache_shape(cls, num_blocks: int, block_size: int, num_kv_heads: int, head_size: int) -> tuple[int, ...]:
        """``(num_blocks, 2, block_size, num_kv_heads, head_size)``, as vLLM's Triton kernel reads it."""
        return (num_blocks, 2, block_size, num_kv_heads, head_size)
