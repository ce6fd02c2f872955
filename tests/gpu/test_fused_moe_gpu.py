"""The Triton fused MoE (``kernels/triton_moe.py``) against its PyTorch definition (``moe.fused_experts_reference``),
on the GPU, in bfloat16 and float32:

- expert shapes (E experts, top k, hidden H, expert width I): Mixtral-like (8, 2), a 64-expert top-4, Qwen3-30B-A3B's
  (128, 8, 2048, 768), gpt-oss-20b's (32, 4, 2880, 2880; its clamped SwiGLU and biases), each at 1..512 tokens;
- the whole layer inside a captured CUDA graph, replayed on new tokens and new routing, equals eager.

``python -m pytest tests/gpu/test_fused_moe_gpu.py -q`` on a GPU (skipped without CUDA).
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import seeded_randn

pytestmark = pytest.mark.gpu

# name -> (E, k, H, I, activation, bias)
SHAPES = {
    "e8-top2": (8, 2, 1024, 1792, "silu", False),
    "e64-top4": (64, 4, 1024, 512, "silu", False),
    "qwen3-30b-a3b": (128, 8, 2048, 768, "silu", False),
    "gpt-oss-20b": (32, 4, 2880, 2880, "swigluoai", True),
}
TOKENS = [1, 3, 16, 64, 129, 512]


def _case(name: str, T: int, dtype: torch.dtype, seed: int = 0):
    E, k, H, I, activation, bias = SHAPES[name]
    randn = seeded_randn(seed, "cuda")
    x = randn(T, H, dt=dtype)
    w13 = randn(E, 2 * I, H, dt=dtype, scale=H**-0.5)
    w2 = randn(E, H, I, dt=dtype, scale=I**-0.5)
    b13 = randn(E, 2 * I, dt=dtype, scale=0.1) if bias else None
    b2 = randn(E, H, dt=dtype, scale=0.1) if bias else None
    logits = randn(T, E, dt=torch.float32)
    return x, w13, w2, b13, b2, logits, k, activation


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("T", TOKENS)
@pytest.mark.parametrize("name", list(SHAPES))
def test_triton_fused_moe_matches_reference(name, T, dtype):
    from attnserve.kernels import triton_moe
    from attnserve.kernels.moe import fused_experts_reference, topk_routing

    x, w13, w2, b13, b2, logits, k, activation = _case(name, T, dtype)
    weights, ids = topk_routing(logits, k, renormalize=True, softmax_after_topk=activation == "swigluoai")
    got = triton_moe.fused_experts(x, w13, w2, weights, ids, activation, b13, b2)
    ref = fused_experts_reference(x, w13, w2, weights, ids, activation, b13, b2)
    assert got.dtype == dtype and got.shape == ref.shape and not got.isnan().any()
    err = (got.float() - ref.float()).abs().max().item()
    scale = ref.float().abs().max().item()
    # float32: exact products (ieee dot), sums in another order; bfloat16: the intermediate rounded to bf16 in
    # both, but a 1-ulp difference of an intermediate element moves the output by up to ~1% of its size
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    assert err <= tol * scale, f"{name} T={T} {dtype}: max |diff| {err:.3g}, max |ref| {scale:.3g}"


def test_fused_moe_layer_in_a_cuda_graph():
    """``FusedMoE.forward`` (routing, schedule, two grouped GEMMs) has no host sync: captured once, it replays on
    new tokens and router logits to exactly the eager result."""
    from attnserve.layers.moe import FusedMoE

    E, k, H, I, T = 128, 8, 2048, 768, 64
    with torch.device("cuda"):
        layer = FusedMoE(E, k, H, I).to(torch.bfloat16)
    randn = seeded_randn(1, "cuda")
    layer.w13_weight.data.copy_(randn(E, 2 * I, H, dt=torch.bfloat16, scale=H**-0.5))
    layer.w2_weight.data.copy_(randn(E, H, I, dt=torch.bfloat16, scale=I**-0.5))
    x, logits = randn(T, H, dt=torch.bfloat16), randn(T, E, dt=torch.bfloat16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        layer(x, logits)  # warm-up: Triton compiles outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = layer(x, logits)
    for seed in (2, 3):
        r = seeded_randn(seed, "cuda")
        x.copy_(r(T, H, dt=torch.bfloat16))
        logits.copy_(r(T, E, dt=torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, layer(x, logits))
