"""Attention sinks (gpt-oss) on the GPU: TRITON_ATTN, FLEX_ATTENTION (and FLASH_ATTN version 4 where installed) against the
reference attention with sinks, on gpt-oss's attention shape (64 query heads, 8 KV heads, head size 64), with and
without its sliding window of 128, bf16 and fp32, every named batch shape (decode_b1_ctx8k takes the split-KV
kernel: the sink is counted once in the merge); and a guard that the sinks change the output (shapes with short contexts).

``python -m pytest tests/gpu/test_sinks_gpu.py -q`` on a GPU (skipped without CUDA).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from attnserve.attention.registry import AttentionBackendEnum
from attnserve.config.attention import AttentionConfig
from attnserve.kernels.reference import reference_paged_attention
from tests.gpu.cases import SHAPES, TOLERANCE, Case, make_step

pytestmark = pytest.mark.gpu

TARGETS = [("TRITON_ATTN", AttentionConfig()), ("FLEX_ATTENTION", AttentionConfig())]
if importlib.util.find_spec("flash_attn") is not None and importlib.util.find_spec("flash_attn.cute") is not None:
    TARGETS.append(("FLASH_ATTN", AttentionConfig(flash_attn_version=4)))


@pytest.mark.parametrize("target", TARGETS, ids=[t[0] for t in TARGETS])
@pytest.mark.parametrize("window", [None, 128], ids=["full", "sw128"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_sinks_match_reference(target, window, dtype, shape):
    name, config = target
    if name == "FLASH_ATTN" and dtype == torch.float32:
        pytest.skip("FlashAttention runs 16-bit only")
    backend = AttentionBackendEnum[name].get_class()
    case = Case(shape, num_heads=64, num_kv_heads=8, head_size=64, block_size=16, dtype=dtype, sliding_window=window)
    st = make_step(backend, case, "cuda", config)
    sinks = (torch.randn(64, generator=torch.Generator().manual_seed(7)) * 3).to("cuda", dtype)
    st.impl.use_sinks(sinks)
    out = st.impl.forward(st.query, st.key, st.value, st.kv_cache, st.metadata)
    torch.cuda.synchronize()
    cache = torch.stack([st.key_cache.float(), st.value_cache.float()])
    args = (st.query.float(), cache, st.query_start_loc, st.seq_lens, st.block_table, st.impl.scale)
    ref = reference_paged_attention(*args, sliding_window=window, sinks=sinks)
    err = (out.float() - ref).abs().max().item() / ref.abs().max().item()
    assert not out.isnan().any() and err <= TOLERANCE[dtype], f"{case.name}: relative error {err:.3g}"
    if shape in ("decode_b1_ctx1", "prefill", "mixed"):  # guard, where short contexts leave the sinks weight
        plain = reference_paged_attention(*args, sliding_window=window)
        assert (plain - ref).abs().max().item() > 10 * TOLERANCE[dtype] * ref.abs().max().item()
