"""Tensor parallelism of the Gemma and mixture-of-experts models on two GPUs (NCCL, spawned workers), bfloat16,
TRITON_ATTN: TP=2's greedy tokens equal TP=1's for tiny random Gemma 2 (both soft caps), Gemma 3 (q/k norms,
2 local : 1 global layers), Qwen3-MoE, Mixtral with a window and gpt-oss with alternating windows (sinks split by
head, experts by intermediate columns, the Triton fused MoE on each rank); a difference is accepted only at a near
tie of TP=1 (``test_tp_gpu._compare``). Needs 2 GPUs; ``python -m pytest tests/gpu/test_tp_models_gpu.py -q -s``.
"""

from __future__ import annotations

import pytest
import torch

from attnserve import SamplingParams
from tests.gpu.test_tp_gpu import TIE, _compare, _run

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")]

PROMPTS = [list(range(100, 140)), [2, 44, 9000, 13, 77, 1200, 5, 6, 7], [15]]  # 40 tokens: past the window of 8


@pytest.mark.parametrize("arch", ["gemma2", "gemma3", "qwen3_moe", "mixtral_sw", "gpt_oss_mixed"])
def test_tiny_model_bfloat16_tp2_matches_tp1(arch, gpu_model_dir):
    path = gpu_model_dir(arch)
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=2)
    engine = dict(dtype="bfloat16", attention_backend="TRITON_ATTN")
    ref, f1 = _run(path, PROMPTS, params, **engine)
    tp, f2 = _run(path, PROMPTS, params, tensor_parallel_size=2, **engine)
    label = f"tiny {arch} bfloat16 TRITON_ATTN"
    print(f"\n[{label}] TP=1 {f1}\n[{label}] TP=2 {f2}")
    assert f2["kv_heads_rank0"] == 1 and f2["exit_codes"] == [0, 0]
    failures = _compare(ref, tp, TIE["bfloat16"], label)
    assert not failures, failures
