"""The fused SwiGLU GEMV (``triton_gemv.gemv(..., act="silu_mul")``) on the GPU, on the down-projection shapes
of Llama-3.1-8B (N 4096, K 14336) and Qwen3-0.6B (N 1024, K 3072), bfloat16:

- inside a captured CUDA graph it gives bit for bit what ``silu_and_mul`` then the plain GEMV of the same
  config gives (every start-up candidate config of the fused GEMV, M = 1, 2, 3, 4, 8, 16, 24, 32, 40, 48, 64,
  replays on new inputs);
- the start-up plan for a layer of the Llama shape: its choice table (printed), the margin kept, and the
  layer's ``forward_silu_mul`` inside a graph agreeing with ``silu_and_mul`` + ``F.linear``.

``python -m pytest tests/gpu/test_silu_mul_gemv.py -m gpu -s -q`` on a GPU (skipped without CUDA).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import nn

pytestmark = pytest.mark.gpu

DOWN_SHAPES = {"llama-3.1-8b": (4096, 14336), "qwen3-0.6b": (1024, 3072)}  # (N, K = I)


def _diff(a: torch.Tensor, b: torch.Tensor) -> str:
    return f"{int((a != b).sum())} of {a.numel()} differ, max |diff| {float((a.float() - b.float()).abs().max()):.3g}"


@pytest.mark.parametrize("model", list(DOWN_SHAPES))
@pytest.mark.parametrize("m", [1, 2, 3, 4, 8, 16, 24, 32, 40, 48, 64])
def test_fused_gemv_in_a_graph_equals_silu_and_mul_then_gemv(model, m):
    from attnserve.kernels.fused_ops import silu_and_mul
    from attnserve.layers.gemv_tiles import candidate_configs
    from attnserve.layers.gemv_timing import agrees
    from attnserve.kernels.triton_gemv import default_config, gemv, prepare

    n, k = DOWN_SHAPES[model]
    g = torch.Generator(device="cuda").manual_seed(m)
    gate_up = torch.randn(m, 2 * k, device="cuda", dtype=torch.bfloat16, generator=g) * 3
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) * k**-0.5
    prepare("cuda")
    cfgs = list(dict.fromkeys([default_config(n, k, m, act="silu_mul"), *candidate_configs(n, k, m, act="silu_mul")]))
    for cfg in cfgs:  # compile and warm outside the graph
        gemv(gate_up, w, None, cfg, act="silu_mul")
        gemv(silu_and_mul(gate_up), w, None, cfg)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [(gemv(gate_up, w, None, cfg, act="silu_mul"), gemv(silu_and_mul(gate_up), w, None, cfg))
                for cfg in cfgs]
    for replay in range(3):
        gate_up.copy_(torch.randn(m, 2 * k, device="cuda", dtype=torch.bfloat16, generator=g) * 3)
        graph.replay()
        torch.cuda.synchronize()
        want = F.linear(silu_and_mul(gate_up), w)
        for cfg, (fused, unfused) in zip(cfgs, outs):
            assert torch.equal(fused, unfused), f"{model} m{m} {cfg.label()} replay {replay}: {_diff(fused, unfused)}"
            assert agrees(fused, want), f"{model} m{m} {cfg.label()}: disagrees with F.linear ({_diff(fused, want)})"


class _Down(nn.Module):
    """A lone down projection of (N, K), as GemvPlan.measure and apply find it in a model."""

    def __init__(self, n: int, k: int) -> None:
        super().__init__()
        from attnserve.layers.linear import RowParallelLinear

        self.down_proj = RowParallelLinear(k, n, bias=False, silu_mul_input=True)
        self.down_proj.weight.data = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5


@pytest.mark.parametrize("model", list(DOWN_SHAPES))
def test_plan_choice_table_and_fused_forward_in_a_graph(model):
    from attnserve.layers import gemv_plan, gemv_timing
    from attnserve.layers.activation import SiluAndMul
    from attnserve.kernels.fused_ops import silu_and_mul
    from attnserve.layers.linear import table_entry

    n, k = DOWN_SHAPES[model]
    mod = _Down(n, k)
    plan = gemv_plan.GemvPlan.measure(mod).apply(mod)
    print(f"\nGEMV plan for the {model} down projection ({n}, {k}), {plan.seconds:.1f} s:\n{plan.summary()}")
    assert {key for key in plan.silu_mul} == {(n, k, m) for m in gemv_plan.DECODE_MS}
    for c in plan.silu_mul.values():
        assert c.unfused_us > 0
        assert not c.use_fused or c.fused_us <= (1 - gemv_plan.MARGIN) * c.unfused_us
        plain = plan.choices[(n, k, c.m)]
        assert c.unfused_label == plain.label()  # triton <config>, cuBLASLt or cuBLAS
    # the measured choices, then every bucket forced onto its best fused config (the fused path in a graph)
    forced = gemv_plan.GemvPlan(plan.choices, silu_mul={key: dataclasses.replace(c, use_fused=c.config is not None)
                                                       for key, c in plan.silu_mul.items()})
    down, act = mod.down_proj, SiluAndMul()
    for which, p in (("measured", plan), ("forced", forced)):
        p.apply(mod)
        for m in (1, 3, 8, 40, 64):
            gate_up = torch.randn(m, 2 * k, device="cuda", dtype=torch.bfloat16) * 3
            down.forward_silu_mul(gate_up, act)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                y = down.forward_silu_mul(gate_up, act)
            gate_up.copy_(torch.randn_like(gate_up) * 3)
            graph.replay()
            torch.cuda.synchronize()
            fused = table_entry(down.gemv_silu_mul, m) is not None
            assert fused or which == "measured", f"{model} m{m}: no fused config ran"
            want = F.linear(silu_and_mul(gate_up), down.weight)
            assert gemv_timing.agrees(y, want), f"{model} m{m} {which} plan (fused: {fused}): {_diff(y, want)}"
