"""The GEMV with the SwiGLU in its epilogue (``triton_gemv.gemv(x, gate_up_weight, out_act="silu_mul")``) on the
GPU, on the gate/up shapes of Llama-3.1-8B (2I 28672, K 4096) and Qwen3-0.6B (2I 6144, K 1024), bfloat16:

- inside a captured CUDA graph, launched with PDL where the GPU has it, it gives bit for bit what the plain GEMV
  of the same config then ``silu_and_mul`` gives (every start-up candidate of >= 2 weight rows a program, M = 1,
  3, 16, 40, 64, replays on new inputs);
- the start-up plan of a lone MLP (gate/up and down): every row count fuses the SwiGLU at most at one end, and
  the MLP's forward inside a graph agrees with ``F.linear`` + ``silu_and_mul`` + ``F.linear``, with the plan
  as measured and with every bucket forced onto the fused epilogue.

``python -m pytest tests/gpu/test_gate_up_swiglu_gpu.py -q`` on a GPU (skipped without CUDA).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import nn

pytestmark = pytest.mark.gpu

GATE_UP_SHAPES = {"llama-3.1-8b": (28672, 4096), "qwen3-0.6b": (6144, 1024)}  # (2I, K)


@pytest.fixture
def pdl_on():
    from attnserve.kernels import pdl

    before = pdl.enabled()
    pdl.configure(pdl.supported("cuda"))
    yield
    pdl.configure(before)


def _diff(a: torch.Tensor, b: torch.Tensor) -> str:
    return f"{int((a != b).sum())} of {a.numel()} differ, max |diff| {float((a.float() - b.float()).abs().max()):.3g}"


@pytest.mark.parametrize("model", list(GATE_UP_SHAPES))
@pytest.mark.parametrize("m", [1, 3, 16, 40, 64])
def test_epilogue_in_a_graph_equals_gemv_then_silu_and_mul(model, m, pdl_on):
    from attnserve.kernels.fused_ops import silu_and_mul
    from attnserve.gemv.tiles import candidate_configs
    from attnserve.gemv.timing import agrees
    from attnserve.kernels.triton_gemv import gemv, prepare

    n, k = GATE_UP_SHAPES[model]
    g = torch.Generator(device="cuda").manual_seed(m)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) * k**-0.5
    prepare("cuda")
    cfgs = [c for c in candidate_configs(n, k, m) if c.block_n >= 2]
    assert cfgs
    for cfg in cfgs:  # compile and warm outside the graph
        gemv(x, w, None, cfg, out_act="silu_mul")
        silu_and_mul(gemv(x, w, None, cfg))
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [(gemv(x, w, None, cfg, out_act="silu_mul"), silu_and_mul(gemv(x, w, None, cfg))) for cfg in cfgs]
    for replay in range(3):
        x.copy_(torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g))
        graph.replay()
        torch.cuda.synchronize()
        want = F.linear(x, w)
        for cfg, (fused, unfused) in zip(cfgs, outs):
            assert fused.shape == (m, n // 2)
            assert torch.equal(fused, unfused), f"{model} m{m} {cfg.label()} replay {replay}: {_diff(fused, unfused)}"
            assert agrees(gemv(x, w, None, cfg), want), f"{model} m{m} {cfg.label()}: plain GEMV disagrees"


class _MLP(nn.Module):
    """A lone Llama MLP (a ``SwiGLUMLP``), as GemvPlan finds it in a model."""

    def __init__(self, n: int, k: int) -> None:
        super().__init__()
        from attnserve.models.llama import LlamaMLP

        cfg = type("Cfg", (), dict(hidden_size=k, intermediate_size=n // 2, hidden_act="silu"))()
        self.mlp = LlamaMLP(cfg).to(device="cuda", dtype=torch.bfloat16)
        for p in self.mlp.parameters():
            p.data.normal_(0, p.shape[-1] ** -0.5)


@pytest.mark.parametrize("model", list(GATE_UP_SHAPES))
def test_plan_fuses_the_swiglu_at_one_end_and_the_mlp_agrees_in_a_graph(model, pdl_on):
    from attnserve.gemv import choices
    from attnserve.gemv.methods import table_entry
    from attnserve.gemv.plan import GemvPlan
    from attnserve.kernels.fused_ops import silu_and_mul

    n, k = GATE_UP_SHAPES[model]
    mod = _MLP(n, k)
    plan = GemvPlan.measure(mod).install(mod)
    print(f"\nGEMV plan for the {model} MLP, {plan.seconds:.1f} s:\n{plan.summary()}")
    assert set(plan.swiglu) == {(n, k, m) for m in choices.DECODE_MS}
    for c in plan.swiglu.values():
        assert c.unfused_us > 0
        assert not c.use_fused or c.fused_us <= (1 - choices.MARGIN) * c.unfused_us
    gate_up, down = mod.mlp.gate_up_proj, mod.mlp.down_proj
    forced = dataclasses.replace(
        plan, swiglu={key: dataclasses.replace(c, use_fused=c.config is not None) for key, c in plan.swiglu.items()}
    )
    forced._one_swiglu_fusion_per_mlp()
    for which, p in (("measured", plan), ("forced", forced)):
        p.install(mod)
        method = mod.mlp.mlp_method
        for m in (1, 3, 8, 40, 64):
            ends = (
                table_entry(getattr(method, "swiglu", None), m) is not None,
                table_entry(getattr(method, "silu_mul", None), m) is not None,
            )
            assert not all(ends), f"{model} m{m} {which}: the SwiGLU fused at both ends"
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            mod.mlp(x)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                y = mod.mlp(x)
            x.copy_(torch.randn_like(x))
            graph.replay()
            torch.cuda.synchronize()
            want = F.linear(silu_and_mul(F.linear(x, gate_up.weight)), down.weight)
            # two bf16 GEMMs summed in another order and the SwiGLU's roundings between them
            err = float((y.float() - want.float()).abs().max() / want.float().abs().max())
            assert err <= 2e-2, f"{model} m{m} {which} plan (fused ends {ends}): relative error {err:.3g}"
