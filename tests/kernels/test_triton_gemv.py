"""The Triton GEMV against ``F.linear``: under the Triton interpreter on CPU in every run, compiled on CUDA
with ``-m gpu`` (real Llama-3.1-8B and Qwen3-0.6B shapes, and a CUDA-graph replay).

Tolerances. The kernel sums float32 products in another order than the reference, then rounds once: a
16-bit output is within 1 ulp of the exactly rounded result (float64 reference), and within 2 ulp of
``F.linear`` in the same dtype (which rounds once too, from its own order); an ulp is bounded by
``eps * |value|``, plus a float32 summation slack of 1e-5 of the output's largest magnitude for values
near zero. float32 outputs: within 1e-5 of the largest magnitude.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import run_cases_in_triton_interpreter
from attnserve.kernels.fused_ops import silu_and_mul_torch
from tests.kernels.gemv_cases import make_cases, make_silu_mul_cases, make_swiglu_cases, run

CASES = make_cases()
SILU_MUL_CASES = make_silu_mul_cases()
SWIGLU_CASES = make_swiglu_cases()


def exact(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """``F.linear`` in float64, rounded once to x's dtype."""
    return F.linear(x.double(), w.double(), None if b is None else b.double()).to(x.dtype)


def assert_close(name: str, got: torch.Tensor, want: torch.Tensor, ulps: int) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, (name, got.dtype, got.shape, want.shape)
    scale = float(want.float().abs().max().clamp_min(1e-30))
    if got.dtype == torch.float32:
        err = float((got - want).abs().max()) / scale
        assert err <= 1e-5, f"{name}: relative error {err:.2e}"
        return
    eps = torch.finfo(want.dtype).eps
    torch.testing.assert_close(got.float(), want.float(), rtol=ulps * eps, atol=1e-5 * scale, msg=name)


def assert_case(name: str, case: dict, got: torch.Tensor) -> None:
    x, w, b = case["x"], case["weight"], case["bias"]
    assert_close(name + " vs exact", got, exact(x, w, b), ulps=1)
    assert_close(name + " vs F.linear", got, F.linear(x, w, b), ulps=2)


# ------------------------------------------------------------------------------- Triton interpreter (CPU)
@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    """Every case's result, run in one subprocess under the Triton interpreter."""
    pytest.importorskip("triton")
    return run_cases_in_triton_interpreter(
        "tests.kernels.gemv_cases", {**CASES, **SILU_MUL_CASES, **SWIGLU_CASES}, tmp_path_factory.mktemp("gemv")
    )


@pytest.mark.parametrize("name", list(CASES))
def test_gemv_matches_f_linear_in_interpreter(name, interpreted):
    assert_case(name, CASES[name], interpreted[name])


def assert_silu_mul_case(
    name: str, case: dict, fused: torch.Tensor, unfused: torch.Tensor, act: torch.Tensor | None = None
) -> None:
    """The fused GEMV is bitwise the plain GEMV (same config) of ``silu_and_mul``'s output, and within the
    GEMV tolerances of ``F.linear(act, weight, bias)``; ``act``: the SwiGLU output, by default the PyTorch
    definition ``silu_and_mul_torch(x)`` (the interpreter's kernel gives its bits)."""
    assert torch.equal(fused, unfused), (
        f"{name}: fused != silu_and_mul + GEMV in {int((fused != unfused).sum())} of {fused.numel()} outputs, "
        f"max |diff| {float((fused.float() - unfused.float()).abs().max()):.3g}"
    )
    assert_case(name, dict(case, x=silu_and_mul_torch(case["x"]) if act is None else act), fused)


@pytest.mark.parametrize("name", list(SILU_MUL_CASES))
def test_silu_mul_gemv_matches_silu_and_mul_then_gemv_in_interpreter(name, interpreted):
    assert_silu_mul_case(name, SILU_MUL_CASES[name], *interpreted[name])


def assert_swiglu_close(name: str, got: torch.Tensor, want: torch.Tensor, gate_up: torch.Tensor, ulps: int) -> None:
    """``got`` and ``want`` (M, N) are both ``silu(gate) * up`` of gate/up outputs within ``ulps`` ulp of each
    other, ``gate_up`` (M, 2N) one of them: a gate and an up off by ``ulps * eps`` of their magnitude, then
    the silu and the product each rounded once on either side, so elementwise within
    ``ulps * eps * (|gate * silu'(gate)| + 2 |silu(gate)|) * |up|`` (the first term the silu's condition
    number: large where the gate is very negative and the output tiny), plus the GEMV's float32 summation
    slack of 1e-5 of the output's largest magnitude. float32 outputs: within 1e-5 of the largest magnitude
    (as :func:`assert_close`)."""
    assert got.shape == want.shape, (name, got.shape, want.shape)
    err = (got.double() - want.double()).abs()
    scale = float(want.double().abs().max().clamp_min(1e-30))
    if got.dtype == torch.float32:
        assert float(err.max()) / scale <= 1e-5, f"{name}: relative error {float(err.max()) / scale:.2e}"
        return
    g, u = gate_up.double().chunk(2, dim=-1)
    sig = torch.sigmoid(g)
    d_silu = sig * (1 + g * (1 - sig))
    bound = ulps * torch.finfo(got.dtype).eps * ((g * d_silu).abs() + 2 * (g * sig).abs()) * u.abs() + 1e-5 * scale
    worst = float((err / bound).max())
    assert worst <= 1, f"{name}: {worst:.2f} x the bound, {int((err > bound).sum())} of {got.numel()} outputs"


@pytest.mark.parametrize("name", list(SWIGLU_CASES))
def test_swiglu_epilogue_gemv_matches_gemv_then_silu_and_mul_in_interpreter(name, interpreted):
    """``out_act="silu_mul"``: (M, N) bit for bit the ``silu_and_mul`` kernel of the plain GEMV (same config) of
    the (2N, K) weight, and close to the SwiGLU of ``F.linear(x, weight, bias)``: within 1 ulp of gate/up of
    the float64 one (the plain GEMV's 1 ulp of the exactly rounded result), within 2 of ``silu_and_mul`` of
    ``F.linear`` in the dtype; the plain GEMV itself within the GEMV tolerances of ``F.linear``."""
    case = SWIGLU_CASES[name]
    x, w, b = case["x"], case["weight"], case["bias"]
    fused, plain, unfused = interpreted[name]
    assert fused.dtype == x.dtype and fused.shape == (x.shape[0], w.shape[0] // 2), (name, fused.dtype, fused.shape)
    assert torch.equal(fused, unfused), (
        f"{name}: fused != GEMV + silu_and_mul in {int((fused != unfused).sum())} of {fused.numel()} outputs, "
        f"max |diff| {float((fused.float() - unfused.float()).abs().max()):.3g}"
    )
    assert_case(name + " plain", case, plain)
    exact_gate_up = F.linear(x.double(), w.double(), None if b is None else b.double())
    assert_swiglu_close(name + " vs exact", fused, silu_and_mul_torch(exact_gate_up), exact_gate_up, ulps=1)
    gate_up = F.linear(x, w, b)
    assert_swiglu_close(name + " vs F.linear", fused, silu_and_mul_torch(gate_up), gate_up, ulps=2)


def test_silu_mul_gemv_refuses_a_plain_width_x():
    pytest.importorskip("triton")
    from attnserve.kernels.triton_gemv import gemv

    x, w = torch.zeros(1, 8), torch.zeros(4, 8)
    with pytest.raises(AssertionError):
        gemv(x, w, act="silu_mul")  # x must be (M, 2K)
    with pytest.raises(ValueError, match="act"):
        gemv(torch.zeros(1, 16), w, act="gelu_mul")


def test_swiglu_epilogue_refuses_bad_arguments():
    """Each refused before a launch: an unknown out_act, a prologue and an epilogue at once, an odd number
    of gate/up rows, a tile of one weight row (no gate / up halves)."""
    pytest.importorskip("triton")
    from attnserve.kernels.triton_gemv import GemvConfig, gemv

    x, w = torch.zeros(1, 8), torch.zeros(6, 8)
    with pytest.raises(ValueError, match="out_act must be one of"):
        gemv(x, w, out_act="gelu_mul")
    with pytest.raises(ValueError, match="prologue or epilogue, not both"):
        gemv(torch.zeros(1, 16), w, act="silu_mul", out_act="silu_mul")
    with pytest.raises(ValueError, match="even row count, got 5"):
        gemv(x, torch.zeros(5, 8), out_act="silu_mul")
    with pytest.raises(ValueError, match="block_n >= 2"):
        gemv(x, w, config=GemvConfig(block_n=1, block_k=16), out_act="silu_mul")


def test_swiglu_epilogue_of_no_rows_is_empty():
    pytest.importorskip("triton")
    from attnserve.kernels.triton_gemv import GemvConfig, gemv

    got = gemv(torch.zeros(0, 8), torch.zeros(6, 8), None, GemvConfig(block_n=2, block_k=16), out_act="silu_mul")
    assert got.shape == (0, 3)


def test_split_k_counters_are_reset_after_every_launch(interpreted):
    """The last split of each tile puts its counter back to 0: the next launch (or graph replay) starts clean."""
    assert int(interpreted["__counters__"].abs().sum()) == 0


def test_layers_route_decode_rows_through_the_plan_in_interpreter(interpreted):
    """Every linear layer and both kinds of LM head (tied, untied) of tiny Llama-family models, with a
    plan that picks Triton everywhere: 1, 3 and 40 rows go through the GEMV, 65 rows through F.linear."""
    layers = interpreted["__layers__"]
    assert len([n for n in layers if n.startswith("qwen2.")]) == 4 * (2 * 4 + 1)  # 2 layers x 4 linears + head
    assert any(".lm_head." in n for n in layers) and any(".embed_tokens." in n for n in layers)
    for name, (got, want) in layers.items():
        if name.endswith("rows65"):
            assert torch.equal(got, want), name
        else:
            assert_close(name, got, want, ulps=2)


def test_mlp_routes_decode_rows_through_the_fused_silu_mul_gemv_in_interpreter(interpreted):
    """Each MLP of a tiny Llama (float32, MLP bias) and Qwen3 (bfloat16) with a plan that picks the fused
    GEMV everywhere: 1, 3 and 40 rows take it (and equal silu_and_mul + the plain GEMV bit for bit), 65 rows
    take SiluAndMul + F.linear."""
    mlps = interpreted["__silu_mul_mlp__"]
    assert len(mlps) == 2 * 2 * 4
    for name, (got, want, seen) in mlps.items():
        assert torch.equal(got, want), (name, float((got.float() - want.float()).abs().max()))
        rows = int(name.rsplit("rows", 1)[1])
        assert seen == ([rows] if rows <= 64 else []), (name, seen)


def test_mlp_routes_decode_rows_through_the_gate_up_swiglu_epilogue_in_interpreter(interpreted):
    """Each MLP of a tiny Llama (float32, MLP bias) and Qwen3 (bfloat16) with a plan that picks the gate/up
    GEMV with the SwiGLU epilogue everywhere (and down's SwiGLU prologue as well): 1, 3 and 40 rows take the
    epilogue, not the prologue, then down's plain GEMV (and equal the silu_and_mul kernel of gate/up's plain
    GEMV, then down's, bit for bit); 65 rows take the layers and SiluAndMul."""
    mlps = interpreted["__swiglu_mlp__"]
    assert len(mlps) == 2 * 2 * 4
    for name, (got, want, seen_up, seen_down) in mlps.items():
        assert torch.equal(got, want), (name, float((got.float() - want.float()).abs().max()))
        rows = int(name.rsplit("rows", 1)[1])
        assert seen_up == ([rows] if rows <= 64 else []) and seen_down == [], (name, seen_up, seen_down)


# ------------------------------------------------------------------------------------- launch choices
def test_default_config_fills_the_gpu_and_keeps_whole_steps():
    """At least 2 programs per SM, unless K is split 16 ways or more, or (tensor cores) one more split would
    leave fewer than 4 * M K elements per split (partials over half the weight bytes)."""
    pytest.importorskip("triton")
    from attnserve.kernels.triton_gemv import default_config

    for n, k in [(6144, 4096), (4096, 14336), (128256, 4096), (1024, 2048), (1024, 3072), (151936, 1024)]:
        for m in (1, 2, 4, 8, 16, 32, 48, 64):
            cfg = default_config(n, k, m)
            programs = -(-n // cfg.block_n) * cfg.splits(k)
            assert programs >= 2 * 132 or cfg.split_k >= 16 or (cfg.dot and k // (2 * cfg.split_k) < 4 * m), (
                n,
                k,
                m,
                cfg,
            )
            assert cfg.k_per_split(k) % cfg.block_k == 0 and cfg.k_per_split(k) >= cfg.block_k
            assert cfg.splits(k) * cfg.k_per_split(k) >= k > (cfg.splits(k) - 1) * cfg.k_per_split(k)
            assert not cfg.dot or cfg.k_per_split(k) >= min(k, 4 * m), (n, k, m, cfg)


def test_default_config_past_16_rows_is_tensor_cores_within_the_shared_memory_budget():
    """17..64 rows: the dot path in every dtype (the FMA path stops at MAX_FMA_M), x tiles of 32 or 64 rows,
    pipelined tiles within SMEM_BUDGET; the SwiGLU variant keeps its prologue's x tile at <= 32 elements per
    thread (the 64 x 128 tile of the plain default would spill registers)."""
    pytest.importorskip("triton")
    from attnserve.kernels.triton_gemv import MAX_FMA_M, SMEM_BUDGET, default_config

    assert MAX_FMA_M == 16
    for n, k in [(6144, 4096), (4096, 14336), (128256, 4096), (1024, 2048), (1024, 3072), (151936, 1024)]:
        for m in (17, 24, 32, 33, 48, 64):
            for elem_bytes in (2, 4):
                cfg = default_config(n, k, m, elem_bytes)
                assert cfg.dot and cfg.block_m(m) == (32 if m <= 32 else 64), (n, k, m, cfg)
                assert cfg.smem_bytes(m, elem_bytes) <= SMEM_BUDGET and cfg.num_stages >= 2, (n, k, m, cfg)
                fused = default_config(n, k, m, elem_bytes, act="silu_mul")
                assert fused.smem_bytes(m, elem_bytes, "silu_mul") <= SMEM_BUDGET, (n, k, m, fused)
                assert cfg.block_m(m) * fused.block_k <= 32 * 32 * fused.num_warps, (n, k, m, fused)
                assert (fused.block_n, fused.split_k, fused.dot) == (cfg.block_n, cfg.split_k, cfg.dot)
    assert default_config(1024, 3072, 64).label() == "dot n64 k128 s8 w4 st3"
    assert default_config(1024, 3072, 64, act="silu_mul").label() == "dot n64 k64 s8 w4 st3"
    assert default_config(151936, 1024, 64).label() == "dot n128 k128 s1 w4 st3"  # 1187 tiles: no split


def test_bad_configs_are_refused():
    pytest.importorskip("triton")
    from attnserve.kernels.triton_gemv import GemvConfig, check_config

    with pytest.raises(ValueError, match="powers of 2"):
        check_config(GemvConfig(block_n=24, block_k=64), 1, torch.bfloat16)
    with pytest.raises(ValueError, match="block_n >= 16"):
        check_config(GemvConfig(block_n=8, block_k=64, dot=True), 1, torch.bfloat16)
    with pytest.raises(ValueError, match="1..64 rows"):
        check_config(GemvConfig(block_n=16, block_k=64, dot=True), 65, torch.bfloat16)
    with pytest.raises(ValueError, match="1..64 rows"):
        check_config(GemvConfig(block_n=16, block_k=64, dot=True), 0, torch.bfloat16)
    with pytest.raises(ValueError, match="FMA path takes 1..16 rows"):
        check_config(GemvConfig(block_n=8, block_k=64), 17, torch.bfloat16)
    for m in (16, 17, 48, 64):
        check_config(GemvConfig(block_n=16, block_k=64, dot=True), m, torch.float32)
    check_config(GemvConfig(block_n=8, block_k=64), 16, torch.bfloat16)


def test_kernel_is_not_specialized_on_the_row_count():
    """One compiled kernel per bucket config for every row count it serves (Triton would key M % 16 == 0
    and M == 1 apart: a compile at the first 40-row LM head of a 48-row bucket), and per split count."""
    pytest.importorskip("triton")
    from attnserve.kernels.triton_gemv import _gemv_kernel

    assert {p.name for p in _gemv_kernel.params if p.do_not_specialize} == {"M", "splits"}


def test_gemv_refuses_65_rows():
    pytest.importorskip("triton")
    from attnserve.kernels.triton_gemv import GemvConfig, gemv

    with pytest.raises(ValueError, match="1..64 rows"):
        gemv(torch.zeros(65, 32), torch.zeros(16, 32), config=GemvConfig(block_n=16, block_k=32, dot=True))


# ----------------------------------------------------------------------------------- compiled, on CUDA
# Llama-3.1-8B and Qwen3-0.6B (N, K): qkv, o, gate_up, down, lm_head
REAL_SHAPES = [
    (6144, 4096),
    (4096, 4096),
    (28672, 4096),
    (4096, 14336),
    (128256, 4096),
    (4096, 1024),
    (1024, 2048),
    (6144, 1024),
    (1024, 3072),
    (151936, 1024),
]


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_gemv_matches_f_linear_on_cuda(name):
    case = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in CASES[name].items()}
    from attnserve.kernels.triton_gemv import gemv

    assert_case(
        name, {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in case.items()}, run(case, gemv).cpu()
    )


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(SILU_MUL_CASES))
def test_silu_mul_gemv_matches_silu_and_mul_then_gemv_on_cuda(name):
    """Compiled: bitwise equality needs the fused kernel's no-contraction build and its ``tl.fma`` to
    reproduce the silu_and_mul kernel and the plain GEMV's contracted FMA exactly."""
    from attnserve.kernels.fused_ops import silu_and_mul
    from tests.kernels.gemv_cases import run_silu_mul_pair

    case = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in SILU_MUL_CASES[name].items()}
    fused, unfused = run_silu_mul_pair(case)
    assert_silu_mul_case(name, SILU_MUL_CASES[name], fused.cpu(), unfused.cpu(), silu_and_mul(case["x"]).cpu())


@pytest.mark.gpu
@pytest.mark.parametrize("n,k", REAL_SHAPES)
@pytest.mark.parametrize("m", [1, 3, 8, 16, 24, 48, 64])
def test_gemv_real_shapes_on_cuda(n, k, m):
    from attnserve.gemv.tiles import candidate_configs
    from attnserve.kernels.triton_gemv import gemv

    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) * k**-0.5
    want = F.linear(x, w)
    for cfg in [None, *candidate_configs(n, k, m)]:
        got = gemv(x, w, None, cfg)
        assert_close(f"{n}x{k} m{m} {cfg}", got, want, ulps=2)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [4, 48])
def test_gemv_replays_in_a_cuda_graph(m):
    """Split-K and not, captured after a warm-up; replays read new inputs and reuse the counters. 48 rows:
    tensor-core tiles only (x tiles of 64 rows, 16 of them padding)."""
    from attnserve.kernels.triton_gemv import GemvConfig, gemv

    x = torch.randn(m, 2048, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1024, 2048, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
    cfgs = (
        [GemvConfig(16, 256, 8), GemvConfig(32, 128, 16, dot=True), GemvConfig(16, 512)]
        if m <= 16
        else [
            GemvConfig(64, 128, 8, num_stages=3, dot=True),
            GemvConfig(32, 128, 16, num_stages=4, dot=True),
            GemvConfig(128, 128, 1, num_warps=8, num_stages=3, dot=True),
        ]
    )
    for cfg in cfgs:
        gemv(x, w, b, cfg)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [gemv(x, w, b, cfg) for cfg in cfgs]
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        for cfg, out in zip(cfgs, outs):
            assert_close(str(cfg), out, F.linear(x, w, b), ulps=2)


@pytest.mark.gpu
@pytest.mark.parametrize("n,k", REAL_SHAPES)
def test_whole_k_tiles_on_real_shapes_on_cuda(n, k):
    """The plan's one-step tiles (``gemv.tiles.whole_k_config``) at 1, 2 and 4 rows: eager against ``F.linear``,
    and captured in a CUDA graph with PDL on (the weight loaded before the wait where K is a power of 2):
    replays with new inputs give the eager kernel's bits."""
    from attnserve.kernels import pdl
    from attnserve.gemv.tiles import whole_k_config
    from attnserve.kernels.triton_gemv import gemv

    g = torch.Generator(device="cuda").manual_seed(1)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) * k**-0.5
    for m in (1, 2, 4):
        cfg = whole_k_config(n, k, m)
        if cfg is None:
            continue
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
        assert_close(f"{n}x{k} m{m} {cfg.label()}", gemv(x, w, None, cfg), F.linear(x, w), ulps=2)
        try:
            pdl.configure(True)
            gemv(x, w, None, cfg)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = gemv(x, w, None, cfg)
            for _ in range(2):
                x.copy_(torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g))
                graph.replay()
                torch.cuda.synchronize()
                pdl.configure(False)
                assert torch.equal(out, gemv(x, w, None, cfg)), (n, k, m, cfg.label())
                pdl.configure(True)
        finally:
            pdl.configure(False)
