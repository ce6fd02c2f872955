"""``use_skinny_gemm`` on the GPU: the start-up GemvPlan on the default model (max_num_seqs 64: buckets 1, 2,
4, 8, 16, 32, 48, 64 measured), and decode steps replayed with Triton GEMVs in every linear layer and the LM
head computing what cuBLAS computes.

The second test forces Triton wherever a candidate runs and agrees with F.linear (margin -10), so the
kernels inside the captured graphs are exercised whatever the timings say: the plain GEMVs, and in each MLP
the SwiGLU fused into the gate/up GEMV's epilogue (``SwiGLUGemvMethod.swiglu``) or into the down projection's
GEMV (``SwiGLUGemvMethod.silu_mul``), whichever pair the timings favour per row count, for decode steps of 3, 40 and 64
requests (the 4-, 48- and 64-row graphs; the LM head sees the exact count).
"""

from __future__ import annotations

import gc

import pytest
import torch

from attnserve import LLM, SamplingParams
from attnserve.engine.scheduler import ScheduledRequest, SchedulerOutput
from attnserve.gemv import choices as gemv_plan
from attnserve.gemv.methods import GemvLinearMethod, SwiGLUGemvMethod
from attnserve.gemv.plan import gemv_layers, swiglu_mlps
from tests.gpu.test_cuda_graphs import (  # noqa: F401 (fixture)
    GREEDY,
    PROMPTS,
    default_gguf,
    prefill_then_decode_step,
)

pytestmark = pytest.mark.gpu


def _llm(path: str) -> LLM:
    return LLM(
        path,
        dtype="bfloat16",
        device="cuda",
        attention_backend="TRITON_ATTN",
        kv_cache_memory=1 << 30,
        max_num_seqs=64,
        use_skinny_gemm=True,
    )


def decode_step_of(llm: LLM, n: int) -> SchedulerOutput:
    """Prefill ``n`` requests (PROMPTS in turn, 4 blocks each) one eager step each, then return one decode
    step of all ``n`` (a graph replay of the smallest bucket >= n, or eager)."""
    runner = llm.engine.runner
    prompts = [llm.tokenizer.encode(PROMPTS[i % len(PROMPTS)]) for i in range(n)]
    tables = [[4 * i + j for j in range(4)] for i in range(n)]
    for i, p in enumerate(prompts):
        runner.compute_logits(SchedulerOutput([ScheduledRequest(f"n{n}.r{i}", p, 0, tables[i], GREEDY, True)]))
    return SchedulerOutput(
        [ScheduledRequest(f"n{n}.r{i}", [42 + i], len(p), tables[i], GREEDY, True) for i, p in enumerate(prompts)]
    )


def test_plan_keeps_triton_only_where_faster(default_gguf):
    llm = _llm(default_gguf)
    plan = llm.engine.runner.gemv_plan
    print(f"\nGEMV plan of the default model, {plan.seconds:.1f} s:\n{plan.summary()}")
    shapes = {tuple(w.shape) for _, w in gemv_layers(llm.engine.runner.model)}
    assert {(n, k) for n, k, _ in plan.choices} == shapes
    assert {m for _, _, m in plan.choices} == set(gemv_plan.DECODE_MS)  # the captured buckets up to 64
    for c in plan.choices.values():
        assert c.cublas_us > 0 and c.cublaslt_us is not None and c.cublaslt_us > 0  # measured, and agreed
        assert not c.use_triton or c.triton_us <= (1 - gemv_plan.MARGIN) * c.cublas_us
        assert not c.use_cublaslt or (c.cublaslt_us <= (1 - gemv_plan.LT_MARGIN) * c.cublas_us and not c.use_triton)
    downs = {tuple(m.down_proj.weight.shape) for m in swiglu_mlps(llm.engine.runner.model)}
    assert downs and {(n, k) for n, k, _ in plan.silu_mul} == downs
    for c in plan.silu_mul.values():
        assert not c.use_fused or c.fused_us <= (1 - gemv_plan.MARGIN) * c.unfused_us
    out = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    assert all(len(o.outputs[0].token_ids) == 8 for o in out)
    del llm
    gc.collect()
    torch.cuda.empty_cache()


def test_decode_graph_with_triton_gemvs_matches_cublas(default_gguf, monkeypatch):
    monkeypatch.setattr(gemv_plan, "MARGIN", -10.0)
    llm = _llm(default_gguf)
    runner = llm.engine.runner
    layers = [m for m, _ in gemv_layers(runner.model)]
    assert all(
        isinstance(m.quant_method, GemvLinearMethod) and all(f is not None for f in m.quant_method.table[1:])
        for m in layers
    )
    mlps = swiglu_mlps(runner.model)
    assert mlps and all(isinstance(mlp.mlp_method, SwiGLUGemvMethod) for mlp in mlps)
    for method in (mlp.mlp_method for mlp in mlps):  # every row count fuses the SwiGLU at exactly one end
        ends = [
            (
                method.swiglu is not None and method.swiglu[r] is not None,
                method.silu_mul is not None and method.silu_mul[r] is not None,
            )
            for r in range(1, 65)
        ]
        assert all(a != b for a, b in ends), ends
    print(f"\nSwiGLU part of the forced plan:\n{runner.gemv_plan.summary().split('SwiGLU layers')[1]}")
    for n in (3, 40, 64):  # the 4-, 48- and 64-row graphs (past 16 rows: tensor-core tiles only)
        step = prefill_then_decode_step(llm) if n == 3 else decode_step_of(llm, n)
        before = runner.cuda_graphs.replays
        triton_logits = runner.compute_logits(step).float().cpu()  # the bucket's graph, an n-row LM head
        assert runner.cuda_graphs.replays == before + 1
        # the plan's methods off (each module back on its class's plain method), then on again
        saved = [m.__dict__.pop("quant_method") for m in layers]
        saved_mlp = [mlp.__dict__.pop("mlp_method") for mlp in mlps]
        graphs, runner.cuda_graphs = runner.cuda_graphs, None
        cublas_logits = runner.compute_logits(step).float().cpu()
        runner.cuda_graphs = graphs
        for m, method in zip(layers, saved):
            m.quant_method = method
        for mlp, method in zip(mlps, saved_mlp):
            mlp.mlp_method = method
        err = ((triton_logits - cublas_logits).abs().max() / cublas_logits.abs().max()).item()
        print(
            f"decode logits of {n} requests, Triton GEMVs (fused SwiGLU) in a graph vs SiluAndMul + "
            f"cuBLAS eager: max relative difference {err:.2e}"
        )
        assert not torch.isnan(triton_logits).any()
        # bf16 GEMMs summed in another order, through 30 layers: measured on an H200 1.35e-2 (3 rows), 1.88e-2
        # (40), 2.61e-2 (64: the largest of more logits); a wrong row, bucket or stale buffer gives ~1
        assert err <= 4e-2, (n, err)
    before = runner.cuda_graphs.replays
    out = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))
    assert runner.cuda_graphs.replays > before + 20
    assert all(len(o.outputs[0].token_ids) == 24 for o in out)
    del llm
    gc.collect()
    torch.cuda.empty_cache()


def test_second_start_loads_the_plan_the_first_measured(default_gguf, tmp_path, monkeypatch, caplog):
    """Two engines of one configuration, a fresh cache folder: the first measures and saves the plan, the second
    (same GPU, versions, dtype, shapes, code: the same key) loads that file, times nothing, and installs the
    same choices. With use_skinny_gemm unset: on by default here (CUDA, CUDA graphs, Triton)."""
    import logging

    monkeypatch.setenv("ATTNSERVE_CACHE_DIR", str(tmp_path))
    plans, lines = [], []
    for _ in range(2):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="attnserve.gemv"):
            llm = LLM(
                default_gguf,
                dtype="bfloat16",
                attention_backend="TRITON_ATTN",
                kv_cache_memory=1 << 30,
                max_num_seqs=64,
            )
        assert llm.engine.config.use_skinny_gemm is None and llm.engine.runner.gemv_plan is not None
        plans.append(llm.engine.runner.gemv_plan)
        lines.append([r.getMessage() for r in caplog.records if r.getMessage().startswith("GEMV plan ")])
        del llm
        gc.collect()
        torch.cuda.empty_cache()
    files = list((tmp_path / "gemv").glob("*.json"))
    assert len(files) == 1
    print(f"\nfirst start: {lines[0][-2:]}\nsecond start: {lines[1]}")
    assert any(m.startswith("GEMV plan measured in ") and m.endswith(f"saved to {files[0]}") for m in lines[0])
    assert any(m.startswith(f"GEMV plan loaded from {files[0]} (no timing") for m in lines[1])
    assert not any(m.startswith("GEMV plan timings") for m in lines[1])
    first, second = plans
    assert (first.choices, first.silu_mul, first.swiglu, first.greedy) == (
        second.choices,
        second.silu_mul,
        second.swiglu,
        second.greedy,
    )


@pytest.mark.parametrize("rows", [1, 64])
def test_cublaslt_linear_agrees_and_leaves_the_preference_as_it_was(rows):
    from attnserve.gemv.blas import cublaslt_linear
    from attnserve.gemv.timing import agrees

    x = torch.randn(rows, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(14336, 4096, device="cuda", dtype=torch.bfloat16) * 0.02
    before = torch.backends.cuda.preferred_blas_library()
    assert agrees(cublaslt_linear(x, w), torch.nn.functional.linear(x, w))
    assert torch.backends.cuda.preferred_blas_library() == before
