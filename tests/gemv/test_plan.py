"""GemvPlan without a GPU: row counts -> bucket choices, the launch configurations it tries, the layers it
reaches and the method objects it installs on them, and the switch being inert on CPU. (Measured plans and
graphs with Triton GEMVs: tests/gpu.)"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

pytest.importorskip("triton")

from attnserve.gemv.choices import (  # noqa: E402
    DECODE_MS,
    MARGIN,
    MAX_ROWS,
    GemvChoice,
    SiluMulChoice,
    pick_fastest,
    plan_rows,
)
from attnserve.gemv.methods import GemvLinearMethod, SwiGLUGemvMethod  # noqa: E402
from attnserve.gemv.plan import GemvPlan, gemv_layers, swiglu_mlps  # noqa: E402
from attnserve.gemv.tiles import candidate_configs, sweep_configs  # noqa: E402
from attnserve.kernels.triton_gemv import MAX_FMA_M, MAX_M, SMEM_BUDGET, GemvConfig, check_config  # noqa: E402
from attnserve.model_executor.cuda_graph import capture_sizes  # noqa: E402
from tests.kernels.test_triton_gemv import REAL_SHAPES  # noqa: E402


def _table(module):
    """The GEMV table a plan installed on a linear layer or LM head (None: it kept its plain ``quant_method``)."""
    method = module.quant_method
    return method.table if isinstance(method, GemvLinearMethod) else None


def _mlp_tables(mlp):
    """(gate/up epilogue table, down prologue table) a plan installed on a SwiGLU MLP; (None, None): its plain
    ``mlp_method``."""
    method = mlp.mlp_method
    return (method.swiglu, method.silu_mul) if isinstance(method, SwiGLUGemvMethod) else (None, None)


def _plan(n: int, k: int, use: dict[int, bool]) -> GemvPlan:
    return GemvPlan({(n, k, m): GemvChoice(n, k, m, 10.0, 5.0, GemvConfig(16, 64 * m), u) for m, u in use.items()})


def test_table_maps_row_counts_to_the_next_measured_bucket():
    table = _plan(64, 128, {1: True, 2: False, 4: True, 8: False}).table(64, 128)
    assert len(table) == MAX_ROWS + 1 == 65 and table[0] is None
    assert [f is not None for f in table[1:]] == [True, False, True, True, False, False, False, False] + [False] * 56
    assert table[3].keywords["config"] == table[4].keywords["config"] == GemvConfig(16, 256)
    assert table[1].keywords["config"] == GemvConfig(16, 64)


def test_table_maps_cublaslt_choices_to_cublaslt_linear():
    from attnserve.gemv.blas import cublaslt_linear

    plan = GemvPlan(
        {
            (64, 128, 1): GemvChoice(64, 128, 1, 10.0, 5.0, GemvConfig(16, 64), True, 4.0, False),
            (64, 128, 2): GemvChoice(64, 128, 2, 10.0, 12.0, GemvConfig(16, 64), False, 9.0, True),
            (64, 128, 4): GemvChoice(64, 128, 4, 10.0, 12.0, GemvConfig(16, 64), False, 9.9, False),
        }
    )
    table = plan.table(64, 128)
    assert table[1].keywords["config"] == GemvConfig(16, 64)  # Triton
    assert table[2] is cublaslt_linear
    assert table[3] is None and table[4] is None  # cuBLAS
    summary = plan.summary().splitlines()
    assert summary[0].split()[3:6] == ["cuBLAS", "us", "cuBLASLt"]
    assert summary[2].split()[-1] == "cuBLASLt" and summary[3].split()[-1] == "cuBLAS"


def test_table_maps_every_row_count_to_its_bucket_up_to_64():
    """Every bucket of DECODE_MS chooses Triton with its own config: row count r takes the config of the
    smallest bucket >= r (1, 2, 4, 4, 8 x4, 16 x8, 32 x16, 48 x16, 64 x16)."""
    table = _plan(64, 128, {m: True for m in DECODE_MS}).table(64, 128)
    want = [1, 2, 4, 4] + [8] * 4 + [16] * 8 + [32] * 16 + [48] * 16 + [64] * 16
    assert DECODE_MS == (1, 2, 4, 8, 16, 32, 48, 64) and MAX_ROWS == MAX_M == 64 and len(want) == 64
    assert table[0] is None
    assert [table[r].keywords["config"] for r in range(1, 65)] == [GemvConfig(16, 64 * m) for m in want]


def test_table_of_the_engines_buckets_stops_at_the_largest():
    """max_num_seqs 40: graphs of 1, 2, 4, 8, 16, 32, 40; rows 33..40 take the 40 bucket, 41..64 cuBLAS."""
    rows = plan_rows(capture_sizes(40))
    assert rows == (1, 2, 4, 8, 16, 32, 40)
    table = _plan(64, 128, {m: m != 16 for m in rows}).table(64, 128)
    assert [table[r] is not None for r in range(1, 65)] == [True] * 8 + [False] * 8 + [True] * 24 + [False] * 24
    assert all(table[r].keywords["config"] == GemvConfig(16, 64 * 40) for r in range(33, 41))
    assert table[17].keywords["config"] == GemvConfig(16, 64 * 32)


def test_plan_rows_are_the_captured_buckets_up_to_64():
    assert plan_rows() == DECODE_MS == plan_rows(capture_sizes(512)) == plan_rows(capture_sizes(64))
    assert plan_rows(capture_sizes(16)) == (1, 2, 4, 8, 16)
    assert plan_rows(capture_sizes(1)) == (1,)
    assert plan_rows(capture_sizes(100)) == DECODE_MS  # 80, 96, 100: cuBLAS
    assert plan_rows([64, 8, 65, 0, 8]) == (8, 64)


def test_table_is_none_where_cublas_always_wins_or_nothing_was_measured():
    plan = _plan(64, 128, {m: False for m in DECODE_MS})
    assert plan.table(64, 128) is None and plan.table(32, 128) is None


@pytest.mark.parametrize("n,k", REAL_SHAPES)
def test_tried_configs_are_valid_and_bounded(n, k):
    for m in (*DECODE_MS, 24, 40):
        cands, sweep = candidate_configs(n, k, m), sweep_configs(n, k, m)
        fused = candidate_configs(n, k, m, act="silu_mul")
        assert 3 <= len(cands) <= 7 and len(set(cands)) == len(cands)
        assert 3 <= len(fused) <= 7 and len(set(fused)) == len(fused)
        assert 10 <= len(sweep) <= 40 and len(set(sweep)) == len(sweep)
        for cfg in cands + sweep + fused:
            check_config(cfg, m, torch.bfloat16)
            assert cfg.k_per_split(k) >= cfg.block_k
            assert cfg.smem_bytes(m, 2, "silu_mul" if cfg in fused else "none") <= SMEM_BUDGET, (m, cfg)
            assert cfg.dot or m <= MAX_FMA_M
        for cfg in fused:  # the SwiGLU prologue's x tile: <= 32 elements per thread
            assert cfg.block_m(m) * cfg.block_k <= 32 * 32 * cfg.num_warps, (m, cfg)
        if m <= MAX_FMA_M:  # up to 16 rows the fused GEMV tries the plain GEMV's configs
            assert fused == cands
        for cfg in candidate_configs(n, k, m, elem_bytes=4) + sweep_configs(n, k, m, elem_bytes=4):
            check_config(cfg, m, torch.float32)
            # float32 stays on FMAs (an IEEE float32 dot is slow) while the FMA path takes the rows
            assert cfg.dot == (m > MAX_FMA_M), (m, cfg)


def test_unsplit_wide_tile_is_a_candidate_past_16_rows_only(monkeypatch):
    """``UNSPLIT_WIDE_TILE``: a 64-row tensor-core tile of 256-byte K steps (128 bfloat16, 64 float32; K's power
    of 2 when shorter), no split, 4 warps, 4 stages, fitted like the others (the SwiGLU prologue halves its K
    step at 64 rows), the last candidate past 16 rows; ``None`` leaves it out there and changes nothing up
    to 16 rows."""
    from attnserve.gemv import tiles as gemv_tiles

    shapes = [(6144, 1024), (1024, 3072), (28672, 4096), (151936, 1024)]
    unsplit = GemvConfig(64, 128, 1, num_warps=4, num_stages=4, dot=True)
    before = {}
    for n, k in shapes:
        for m in (*DECODE_MS, 24, 40):
            before[(n, k, m)] = candidate_configs(n, k, m)
            if m > MAX_FMA_M:
                assert before[(n, k, m)][-1] == unsplit, (n, k, m)
        assert candidate_configs(n, k, 64, elem_bytes=4)[-1] == GemvConfig(64, 64, 1, 4, 4, dot=True)
        assert candidate_configs(n, k, 64, act="silu_mul")[-1] == GemvConfig(64, 64, 1, 4, 4, dot=True)
    short_k = candidate_configs(100, 40, 24)  # K 40: the unsplit tile is the default's, tried once
    assert short_k[0] == GemvConfig(64, 64, 1, 4, 4, dot=True) and len(set(short_k)) == len(short_k)
    monkeypatch.setattr(gemv_tiles, "UNSPLIT_WIDE_TILE", None)
    for (n, k, m), cands in before.items():
        assert candidate_configs(n, k, m) == (cands[:-1] if m > MAX_FMA_M else cands), (n, k, m)


# (linear shapes + LM head, the down projection, the gate/up projection) of the two models the plan is tuned on
MODEL_SHAPES = {
    "llama-3.1-8b": (REAL_SHAPES[:5], (4096, 14336), (28672, 4096)),
    "qwen3-0.6b": (REAL_SHAPES[5:], (1024, 3072), (6144, 1024)),
}


def _startup_work(shapes, down, gate_up, ms) -> tuple[int, int]:
    """(timings, distinct compiled kernels) of GemvPlan.measure on bfloat16 ``shapes``: per (N, K, M) one
    cuBLAS timing and one per candidate, again for the SwiGLU layer's shape (the prologue) and the gate/up
    shape (the epilogue, candidates of >= 2 weight rows); a kernel per distinct launch (padded rows, tile,
    warps, stages, split or not, K tail or not, act; the kernel does not specialize on M)."""
    timings, kernels = 0, set()
    for n, k in shapes:
        for m in ms:
            acts = (
                ("none", "silu_mul") if (n, k) == down else ("none", "out silu_mul") if (n, k) == gate_up else ("none",)
            )
            for act in acts:
                cands = candidate_configs(n, k, m, act=act if act != "out silu_mul" else "none")
                if act == "out silu_mul":
                    cands = [c for c in cands if c.block_n >= 2]
                timings += 1 + len(cands)
                kernels |= {
                    (
                        c.block_m(m),
                        c.block_n,
                        c.block_k,
                        c.num_warps,
                        c.num_stages,
                        c.dot,
                        c.splits(k) > 1,
                        k % c.block_k == 0,
                        act,
                    )
                    for c in cands
                }
    return timings, len(kernels)


@pytest.mark.parametrize("model", list(MODEL_SHAPES))
def test_startup_work_of_the_plan_is_bounded(model):
    """Rows up to 64 double the plan's work of rows up to 8: ~380-400 timings (a few seconds on an H200) and ~85-100
    Triton compiles (~0.4 s each for sm_90 on one core; cached on disk by Triton for the next start)."""
    shapes, down, gate_up = MODEL_SHAPES[model]
    small = _startup_work(shapes, down, gate_up, (1, 2, 4, 8))
    full = _startup_work(shapes, down, gate_up, DECODE_MS)
    print(f"{model}: rows 1..8 {small[0]} timings, {small[1]} kernels; rows 1..64 {full[0]} timings, {full[1]} kernels")
    assert small[0] <= 195 and small[1] <= 58
    assert full[0] <= 405 and full[1] <= 105


def _tiny(arch: str):
    from attnserve.models.llama import LlamaForCausalLM
    from tests.models.tiny import tiny_config

    return LlamaForCausalLM(tiny_config(arch), lambda spec, i: torch.nn.Identity())


@pytest.mark.parametrize("arch,head", [("llama", "lm_head"), ("llama3", "embed_tokens")])
def test_gemv_layers_are_the_linears_and_the_head_in_use(arch, head):
    model = _tiny(arch)
    names = {id(m): n for n, m in model.named_modules()}
    found = [names[id(m)] for m, _ in gemv_layers(model)]
    assert len(found) == 2 * 4 + 1 and found[-1] == head
    assert {f.split(".")[-1] for f in found[:-1]} == {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}


def test_install_leaves_cublas_layers_untouched():
    model = _tiny("llama")
    plan = GemvPlan(
        {
            (n, k, m): GemvChoice(n, k, m, 1.0, 2.0, GemvConfig(16, 64), False)
            for n, k in {tuple(w.shape) for _, w in gemv_layers(model)}
            for m in DECODE_MS
        }
    )
    plan.install(model)
    assert all(_table(m) is None and "quant_method" not in vars(m) for m, _ in gemv_layers(model))
    assert all(_mlp_tables(mlp) == (None, None) for mlp in swiglu_mlps(model)) and plan.greedy_head is None
    assert "cuBLAS" in plan.summary()


def test_use_skinny_gemm_is_inert_without_cuda_graphs(tiny_model_dir):
    from attnserve import LLM

    llm = LLM(tiny_model_dir("llama"), device="cpu", attention_backend="CPU_ATTN", use_skinny_gemm=True)
    assert llm.engine.config.use_skinny_gemm
    assert llm.engine.runner.gemv_plan is None and llm.engine.runner.greedy_head.fused is None
    assert all(_table(m) is None for m, _ in gemv_layers(llm.engine.runner.model))


# ------------------------------------------------------------------------------------- SwiGLU fusion
def test_pick_fastest_needs_the_margin_over_the_reference():
    a, b = GemvConfig(16, 64), GemvConfig(32, 128)
    assert pick_fastest(10.0, [], MARGIN) == (None, None, False)
    assert pick_fastest(10.0, [(9.6, a), (9.0, b)], MARGIN) == (9.0, b, True)  # 10% faster
    assert pick_fastest(10.0, [(9.6, a)], MARGIN) == (9.6, a, False)  # 4%: not enough
    assert pick_fastest(10.0, [(9.5, a), (9.5, b)], MARGIN) == (9.5, a, True)  # exactly 5%; ties keep the first
    assert pick_fastest(10.0, [(12.0, a)], -10.0)[2]  # a negative margin forces Triton (the GPU tests do)


def _silu_mul_plan(n: int, k: int, use: dict[int, bool]) -> GemvPlan:
    return GemvPlan(
        {(n, k, m): GemvChoice(n, k, m, 10.0, 12.0, GemvConfig(16, 64), False) for m in use},
        silu_mul={
            (n, k, m): SiluMulChoice(n, k, m, 12.0, "cuBLAS", 9.0, GemvConfig(16, 64 * m), u) for m, u in use.items()
        },
    )


def test_silu_mul_table_maps_row_counts_to_fused_gemvs_of_the_next_bucket():
    plan = _silu_mul_plan(64, 128, {1: True, 2: False, 4: True, 8: False, 16: False, 48: True})
    table = plan.silu_mul_table(64, 128)
    assert [f is not None for f in table[1:]] == ([True, False, True, True] + [False] * 12 + [True] * 32 + [False] * 16)
    assert table[17].keywords == dict(config=GemvConfig(16, 64 * 48), act="silu_mul")
    assert table[3].keywords == dict(config=GemvConfig(16, 256), act="silu_mul")
    assert plan.table(64, 128) is None  # the plain choices stay cuBLAS
    assert _silu_mul_plan(64, 128, {m: False for m in DECODE_MS}).silu_mul_table(64, 128) is None
    assert "fused fma n16 k64" in plan.summary() and "silu_and_mul + cuBLAS" in plan.summary()


def test_swiglu_mlps_are_the_layers_mlps():
    for arch in ("llama", "qwen3"):
        model = _tiny(arch)
        names = {id(m): n for n, m in model.named_modules()}
        assert [names[id(m)] for m in swiglu_mlps(model)] == [f"layers.{i}.mlp" for i in range(2)]
        assert all(tuple(m.gate_up_proj.weight.shape) == (256, 64) for m in swiglu_mlps(model))
        assert all(tuple(m.down_proj.weight.shape) == (64, 128) for m in swiglu_mlps(model))


def test_install_sets_the_fused_table_on_the_down_projections_only():
    model = _tiny("llama")
    shapes = {tuple(w.shape) for _, w in gemv_layers(model)}
    down = tuple(model.layers[0].mlp.down_proj.weight.shape)
    plan = GemvPlan(
        {(n, k, m): GemvChoice(n, k, m, 1.0, 2.0, GemvConfig(16, 64), False) for n, k in shapes for m in DECODE_MS},
        silu_mul={
            (*down, m): SiluMulChoice(*down, m, 2.0, "cuBLAS", 1.0, GemvConfig(16, 64), m <= 2) for m in DECODE_MS
        },
    )
    plan.install(model)
    assert all(_table(module) is None for module, _ in gemv_layers(model))
    for mlp in swiglu_mlps(model):
        swiglu, silu_mul = _mlp_tables(mlp)
        assert swiglu is None and [f is not None for f in silu_mul] == [False, True, True] + [False] * 62


def test_mlp_without_a_plan_is_silu_and_mul_then_down():
    """No plan (CPU, or no use_skinny_gemm): the MLP computes exactly what it computed before the fusion."""
    import torch.nn.functional as F

    from attnserve.kernels.fused_ops import silu_and_mul_torch

    model = _tiny("llama")
    for p in model.parameters():
        p.data.normal_(0.0, 0.1)
    mlp = model.layers[0].mlp
    x = torch.randn(3, mlp.gate_up_proj.in_features)
    want = F.linear(silu_and_mul_torch(F.linear(x, mlp.gate_up_proj.weight)), mlp.down_proj.weight)
    assert torch.equal(mlp(x), want)


# ------------------------------------------------------------------------------ SwiGLU in gate/up's epilogue
def _swiglu_plan(n: int, k: int, use: dict[int, bool]) -> GemvPlan:
    return GemvPlan(
        {(n, k, m): GemvChoice(n, k, m, 10.0, 12.0, GemvConfig(16, 64), False) for m in use},
        swiglu={
            (n, k, m): SiluMulChoice(n, k, m, 12.0, "cuBLAS + silu_and_mul", 9.0, GemvConfig(16, 64 * m), u)
            for m, u in use.items()
        },
    )


def test_swiglu_table_maps_row_counts_to_epilogue_gemvs_of_the_next_bucket():
    plan = _swiglu_plan(256, 64, {1: False, 2: True, 4: False, 8: True, 16: False, 32: True, 64: False})
    table = plan.swiglu_table(256, 64)
    assert len(table) == MAX_ROWS + 1 and table[0] is None
    assert [f is not None for f in table[1:]] == (
        [False, True, False, False] + [True] * 4 + [False] * 8 + [True] * 16 + [False] * 32
    )
    assert table[2].keywords == dict(config=GemvConfig(16, 128), out_act="silu_mul")
    assert table[5].keywords == table[8].keywords == dict(config=GemvConfig(16, 512), out_act="silu_mul")
    assert table[17].keywords == dict(config=GemvConfig(16, 64 * 32), out_act="silu_mul")
    from attnserve.kernels.triton_gemv import gemv

    assert table[2].func is gemv and not table[2].args
    assert plan.table(256, 64) is None and plan.silu_mul_table(256, 64) is None  # the plain choices stay cuBLAS
    assert plan.swiglu_table(128, 64) is None  # another shape
    assert _swiglu_plan(256, 64, {m: False for m in DECODE_MS}).swiglu_table(256, 64) is None


def test_install_sets_the_epilogue_table_on_the_gate_up_projections_only(caplog):
    """gate/up (256, 64) fuses at 1 and 2 rows: its table has those, every other layer has none (nor does the
    down projection get a prologue table, no ``silu_mul`` entries), and the log counts both gate/up layers;
    the MLP then computes exactly the epilogue GEMV, then down, for 2 rows (the table's functions are swapped
    for PyTorch here, no Triton launch on CPU)."""
    import logging

    model = _tiny("llama")
    shapes = {tuple(w.shape) for _, w in gemv_layers(model)}
    gate_up = tuple(model.layers[0].mlp.gate_up_proj.weight.shape)
    assert gate_up == (256, 64)
    plan = GemvPlan(
        {(n, k, m): GemvChoice(n, k, m, 1.0, 2.0, GemvConfig(16, 64), False) for n, k in shapes for m in DECODE_MS},
        swiglu={
            (*gate_up, m): SiluMulChoice(*gate_up, m, 2.0, "cuBLAS + silu_and_mul", 1.0, GemvConfig(16, 64), m <= 2)
            for m in DECODE_MS
        },
    )
    with caplog.at_level(logging.INFO, logger="attnserve.gemv"):
        plan.install(model)
    assert "0 of 9 linear layers use the Triton GEMV" in caplog.text
    assert "2 of 4 SwiGLU layers and gate/up layers the fused SwiGLU GEMV" in caplog.text
    assert all(_table(module) is None for module, _ in gemv_layers(model))
    for mlp in swiglu_mlps(model):
        swiglu, silu_mul = _mlp_tables(mlp)
        assert silu_mul is None
        assert [f is not None for f in swiglu] == [False, True, True] + [False] * 62
        assert swiglu[1].keywords == dict(config=GemvConfig(16, 64), out_act="silu_mul")

    import torch.nn.functional as F

    from attnserve.kernels.fused_ops import silu_and_mul_torch

    for p in model.parameters():
        p.data.normal_(0.0, 0.1)
    mlp = model.layers[0].mlp
    calls = []
    epilogue = lambda x, w, b: (calls.append(x.shape[0]), silu_and_mul_torch(F.linear(x, w, b)) * 2)[1]  # noqa: E731
    mlp.mlp_method.swiglu = tuple(None if f is None else epilogue for f in mlp.mlp_method.swiglu)
    x = torch.randn(2, 64)
    assert torch.equal(
        mlp(x), F.linear(silu_and_mul_torch(F.linear(x, mlp.gate_up_proj.weight)) * 2, mlp.down_proj.weight)
    )
    assert calls == [2]
    x = torch.randn(3, 64)  # the 4-row bucket: not fused
    assert torch.equal(mlp(x), F.linear(silu_and_mul_torch(F.linear(x, mlp.gate_up_proj.weight)), mlp.down_proj.weight))
    assert calls == [2]


def _mlp_plan(gate_up_us: dict[str, float], down_us: dict[str, float], m: int = 4) -> GemvPlan:
    """A plan of one MLP, gate/up (256, 64) and down (64, 128), at ``m`` rows, both ends fused: ``*_us``
    'plain' (the layer's choice: Triton for gate/up, cuBLASLt for down, so ``_choice_us`` reads those
    times) and 'fused' (its fused SwiGLU GEMV)."""
    cfg = GemvConfig(16, 64)
    return GemvPlan(
        {
            (256, 64, m): GemvChoice(256, 64, m, 99.0, gate_up_us["plain"], cfg, True, 98.0, False),
            (64, 128, m): GemvChoice(64, 128, m, 99.0, 97.0, cfg, False, down_us["plain"], True),
        },
        silu_mul={(64, 128, m): SiluMulChoice(64, 128, m, 50.0, "cuBLASLt", down_us["fused"], cfg, True)},
        swiglu={(256, 64, m): SiluMulChoice(256, 64, m, 50.0, "triton + silu_and_mul", gate_up_us["fused"], cfg, True)},
    )


def test_one_swiglu_fusion_per_mlp_keeps_the_faster_end():
    """epilogue: gate/up fused + down's choice; prologue: gate/up's choice + down fused; the slower end falls
    back to unfused (a tie keeps the prologue), its other fields kept."""
    # epilogue 5 + 4 = 9 < prologue 6 + 4 = 10: down's prologue goes
    plan = _mlp_plan({"plain": 6.0, "fused": 5.0}, {"plain": 4.0, "fused": 4.0})
    plan._one_swiglu_fusion_per_mlp()
    assert plan.swiglu[(256, 64, 4)].use_fused and not plan.silu_mul[(64, 128, 4)].use_fused
    assert plan.silu_mul[(64, 128, 4)] == SiluMulChoice(64, 128, 4, 50.0, "cuBLASLt", 4.0, GemvConfig(16, 64), False)
    assert plan.silu_mul_table(64, 128) is None and plan.swiglu_table(256, 64)[3] is not None
    # epilogue 5 + 4 = 9 > prologue 6 + 2.5 = 8.5: gate/up's epilogue goes
    plan = _mlp_plan({"plain": 6.0, "fused": 5.0}, {"plain": 4.0, "fused": 2.5})
    plan._one_swiglu_fusion_per_mlp()
    assert not plan.swiglu[(256, 64, 4)].use_fused and plan.silu_mul[(64, 128, 4)].use_fused
    assert plan.swiglu[(256, 64, 4)].fused_us == 5.0 and plan.swiglu[(256, 64, 4)].config == GemvConfig(16, 64)
    assert plan.swiglu_table(256, 64) is None and plan.silu_mul_table(64, 128)[3] is not None
    # a tie: 5 + 4 = 6 + 3
    plan = _mlp_plan({"plain": 6.0, "fused": 5.0}, {"plain": 4.0, "fused": 3.0})
    plan._one_swiglu_fusion_per_mlp()
    assert not plan.swiglu[(256, 64, 4)].use_fused and plan.silu_mul[(64, 128, 4)].use_fused


def test_one_swiglu_fusion_per_mlp_reads_each_layers_chosen_time():
    """``_choice_us``: Triton's time where Triton was chosen, cuBLASLt's where it was, else cuBLAS's."""
    cfg = GemvConfig(16, 64)
    plan = GemvPlan(
        {
            (1, 1, 1): GemvChoice(1, 1, 1, 9.0, 7.0, cfg, True, 8.0, False),
            (1, 1, 2): GemvChoice(1, 1, 2, 9.0, 7.0, cfg, False, 8.0, True),
            (1, 1, 4): GemvChoice(1, 1, 4, 9.0, 7.0, cfg, False, 8.0, False),
        }
    )
    assert [plan._choice_us(1, 1, m) for m in (1, 2, 4)] == [7.0, 8.0, 9.0]
    # down on cuBLAS (9.0, not the unchosen Triton 1.0 or cuBLASLt 7.5): epilogue 5 + 9 = 14 > prologue 6 + 7 = 13
    plan = _mlp_plan({"plain": 6.0, "fused": 5.0}, {"plain": 8.0, "fused": 7.0})
    plan.choices[(64, 128, 4)] = GemvChoice(64, 128, 4, 9.0, 1.0, cfg, False, 7.5, False)
    plan._one_swiglu_fusion_per_mlp()
    assert not plan.swiglu[(256, 64, 4)].use_fused and plan.silu_mul[(64, 128, 4)].use_fused


def test_one_swiglu_fusion_per_mlp_leaves_single_fusions_alone():
    """Only one end fused at a row count, or the down layer of another shape: nothing changes."""
    for ends in ((True, False), (False, True), (False, False)):
        plan = _mlp_plan({"plain": 6.0, "fused": 1.0}, {"plain": 4.0, "fused": 1.0})
        plan.swiglu[(256, 64, 4)] = replace(plan.swiglu[(256, 64, 4)], use_fused=ends[0])
        plan.silu_mul[(64, 128, 4)] = replace(plan.silu_mul[(64, 128, 4)], use_fused=ends[1])
        before = (dict(plan.swiglu), dict(plan.silu_mul))
        plan._one_swiglu_fusion_per_mlp()
        assert (plan.swiglu, plan.silu_mul) == before, ends
    # both fused, but at different row counts (the epilogue at 4, the prologue at 8)
    plan = _mlp_plan({"plain": 6.0, "fused": 1.0}, {"plain": 4.0, "fused": 1.0})
    plan.silu_mul = {(64, 128, 8): replace(plan.silu_mul[(64, 128, 4)], m=8)}
    plan.choices[(64, 128, 8)] = replace(plan.choices[(64, 128, 4)], m=8)
    before = (dict(plan.swiglu), dict(plan.silu_mul))
    plan._one_swiglu_fusion_per_mlp()
    assert (plan.swiglu, plan.silu_mul) == before
    # a down projection of another width (64, 96): not this gate/up's
    plan = _mlp_plan({"plain": 6.0, "fused": 5.0}, {"plain": 4.0, "fused": 1.0})
    plan.silu_mul = {(64, 96, 4): replace(plan.silu_mul[(64, 128, 4)], k=96)}
    plan._one_swiglu_fusion_per_mlp()
    assert plan.swiglu[(256, 64, 4)].use_fused and plan.silu_mul[(64, 96, 4)].use_fused


def test_summary_has_the_gate_up_section():
    plan = _swiglu_plan(256, 64, {1: True, 2: False})
    plan.swiglu[(256, 64, 4)] = SiluMulChoice(256, 64, 4, 12.0, "cuBLAS + silu_and_mul", None, None, False)
    lines = plan.summary().splitlines()
    at = lines.index("gate/up layers: the choice above + silu_and_mul vs the SwiGLU in the GEMV's epilogue")
    assert lines[at + 1].split() == ["N", "K", "M", "unfused", "us", "fused", "us", "choice"]
    assert lines[at + 2].split() == ["256", "64", "1", "12.00", "9.00", "fused", "fma", "n16", "k64", "s1", "w4", "st2"]
    assert lines[at + 3].split() == ["256", "64", "2", "12.00", "9.00", "cuBLAS", "+", "silu_and_mul"]
    assert lines[at + 4].split() == ["256", "64", "4", "12.00", "-", "cuBLAS", "+", "silu_and_mul"]
    assert len(lines) == at + 5
    assert "gate/up layers" not in _plan(64, 128, {1: True}).summary()


def test_swiglu_gemv_method_falls_back_to_the_plain_mlp():
    """A row count with neither table entry: gate/up, ``silu_and_mul``, down, bit for bit the default method;
    one with the prologue entry: the entry takes gate/up's output and down's weight and bias."""
    import torch.nn.functional as F

    from attnserve.kernels.fused_ops import silu_and_mul_torch
    from attnserve.layers.mlp import SwiGLUMLP

    mlp = SwiGLUMLP(64, 128, bias=True)
    for p in mlp.parameters():
        p.data.normal_(0.0, 0.1)
    x = torch.randn(3, 64)
    want = mlp(x)
    prologue = lambda gu, w, b: F.linear(silu_and_mul_torch(gu), w, b) * 2  # noqa: E731
    mlp.mlp_method = SwiGLUGemvMethod(None, (None, prologue) + (None,) * 63)
    assert torch.equal(mlp(x), want)
    x1 = x[:1]
    assert torch.equal(
        mlp(x1), F.linear(silu_and_mul_torch(mlp.gate_up_proj(x1)), mlp.down_proj.weight, mlp.down_proj.bias) * 2
    )
