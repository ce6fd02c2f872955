"""The fused SwiGLU GEMV (``triton_gemv.gemv(..., act="silu_mul")``) on the GPU, on the down-projection shapes
of Llama-3.1-8B (N 4096, K 14336) and Qwen3-0.6B (N 1024, K 3072), bfloat16:

- inside a captured CUDA graph it gives bit for bit what ``silu_and_mul`` then the plain GEMV of the same
  config gives (every start-up candidate config of the fused GEMV, M = 1, 2, 3, 4, 8, 16, 24, 32, 40, 48, 64,
  replays on new inputs);
- the start-up plan for an MLP of the Llama shape: its choice table (printed), the margin kept, and the down
  half of the MLP's installed method (``SwiGLUGemvMethod.down_methods``: the fused GEMV as the down projection's
  method) inside a graph agreeing with ``silu_and_mul`` + ``F.linear``.

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
    from attnserve.gemv.tiles import candidate_configs
    from attnserve.gemv.timing import agrees
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
        outs = [
            (gemv(gate_up, w, None, cfg, act="silu_mul"), gemv(silu_and_mul(gate_up), w, None, cfg)) for cfg in cfgs
        ]
    for replay in range(3):
        gate_up.copy_(torch.randn(m, 2 * k, device="cuda", dtype=torch.bfloat16, generator=g) * 3)
        graph.replay()
        torch.cuda.synchronize()
        want = F.linear(silu_and_mul(gate_up), w)
        for cfg, (fused, unfused) in zip(cfgs, outs):
            assert torch.equal(fused, unfused), f"{model} m{m} {cfg.label()} replay {replay}: {_diff(fused, unfused)}"
            assert agrees(fused, want), f"{model} m{m} {cfg.label()}: disagrees with F.linear ({_diff(fused, want)})"


class _Down(nn.Module):
    """A lone SwiGLU MLP whose down projection is (N, K), as GemvPlan.measure and install find it in a model."""

    def __init__(self, n: int, k: int) -> None:
        super().__init__()
        from attnserve.layers.mlp import SwiGLUMLP

        self.mlp = SwiGLUMLP(n, k).to(device="cuda", dtype=torch.bfloat16)
        self.mlp.gate_up_proj.weight.data = torch.randn(2 * k, n, device="cuda", dtype=torch.bfloat16) * n**-0.5
        self.mlp.down_proj.weight.data = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5


def _down_half(mlp, gate_up: torch.Tensor) -> torch.Tensor:
    """What the MLP's installed method runs after gate/up: the fused GEMV as the down projection's method where
    the plan chose it for these rows, else ``silu_and_mul`` then the down projection."""
    from attnserve.gemv.methods import table_entry

    method = table_entry(getattr(mlp.mlp_method, "down_methods", None), gate_up.shape[0])
    return mlp.down_proj(mlp.act(gate_up)) if method is None else mlp.down_proj.apply_method(method, gate_up)


@pytest.mark.parametrize("model", list(DOWN_SHAPES))
def test_plan_choice_table_and_fused_forward_in_a_graph(model):
    from attnserve.gemv import choices as gemv_plan, timing as gemv_timing
    from attnserve.gemv.methods import table_entry
    from attnserve.gemv.plan import GemvPlan
    from attnserve.kernels.fused_ops import silu_and_mul

    n, k = DOWN_SHAPES[model]
    mod = _Down(n, k)
    plan = GemvPlan.measure(mod).install(mod)
    print(f"\nGEMV plan for the {model} down projection ({n}, {k}), {plan.seconds:.1f} s:\n{plan.summary()}")
    assert {key for key in plan.silu_mul} == {(n, k, m) for m in gemv_plan.DECODE_MS}
    for c in plan.silu_mul.values():
        assert c.unfused_us > 0
        assert not c.use_fused or c.fused_us <= (1 - gemv_plan.MARGIN) * c.unfused_us
        plain = plan.choices[(n, k, c.m)]
        assert c.unfused_label == plain.label()  # triton <config>, cuBLASLt or cuBLAS
    # the measured choices, then every bucket forced onto its best fused config (the fused path in a graph)
    forced = GemvPlan(
        plan.choices,
        silu_mul={key: dataclasses.replace(c, use_fused=c.config is not None) for key, c in plan.silu_mul.items()},
    )
    down = mod.mlp.down_proj
    for which, p in (("measured", plan), ("forced", forced)):
        p.install(mod)
        for m in (1, 3, 8, 40, 64):
            gate_up = torch.randn(m, 2 * k, device="cuda", dtype=torch.bfloat16) * 3
            _down_half(mod.mlp, gate_up)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                y = _down_half(mod.mlp, gate_up)
            gate_up.copy_(torch.randn_like(gate_up) * 3)
            graph.replay()
            torch.cuda.synchronize()
            fused = table_entry(getattr(mod.mlp.mlp_method, "silu_mul", None), m) is not None
            assert fused or which == "measured", f"{model} m{m}: no fused config ran"
            want = F.linear(silu_and_mul(gate_up), down.weight)
            assert gemv_timing.agrees(y, want), f"{model} m{m} {which} plan (fused: {fused}): {_diff(y, want)}"
