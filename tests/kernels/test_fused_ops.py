"""The fused ops: Triton kernels against their PyTorch definitions (under the Triton interpreter on CPU in
every run; compiled, on CUDA, with ``-m gpu``), the device dispatch, and the layers built on them.

Tolerances. Where the kernel does the same float32 operations as PyTorch in the same order (RoPE, the
residual sum) the results must be equal. Two things may differ in the last float32 bit: the RMSNorm
statistic (a sum in another order) and, in the interpreter, ``exp`` (numpy's vs PyTorch's). After the
rounding to 16 bits such a difference flips an output by 1 ulp in rare elements: 16-bit outputs must be
within 1 ulp, and equal in all but a few elements (a wrong rounding rule would change about half); float32
ones within 1e-6 of the tensor's largest magnitude.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnserve.kernels import fused_ops
from tests.helpers import run_cases_in_triton_interpreter
from tests.kernels.fused_cases import DTYPES, TORCH_OPS, make_cases, qk_views, run

ROOT = Path(__file__).resolve().parents[2]
CASES = make_cases()


def _ordered(x: torch.Tensor) -> torch.Tensor:
    """16-bit floats as integers in the floats' order (adjacent floats differ by 1)."""
    bits = x.view(torch.int16).int()
    return torch.where(bits < 0, -(bits & 0x7FFF), bits)


def assert_close(name: str, got: torch.Tensor, want: torch.Tensor, case: dict) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, name
    exact = case["op"] == "rotary" and case["q_norm"] is None
    if exact or got.numel() == 0:
        assert torch.equal(got, want), name
        return
    scale = want.float().abs().max().clamp_min(1e-30)
    if got.dtype == torch.float32:
        err = float((got - want).abs().max() / scale)
        assert err <= 1e-6, f"{name}: relative error {err:.2e}"
        return
    differ = float((got != want).float().mean())
    assert differ < 0.01, f"{name}: {differ:.2%} of the elements differ"
    if case["op"] == "rotary":  # rotation after the norm: 1 ulp of a normalized value, at the head's scale
        head_max = want.float().view(want.shape[0], -1, case["d"]).abs().amax(-1, keepdim=True)
        err = (got.float() - want.float()).view(want.shape[0], -1, case["d"]).abs()
        assert bool((err <= torch.finfo(want.dtype).eps * head_max).all()), name
    else:
        ulps = int((_ordered(got) - _ordered(want)).abs().max())
        assert ulps <= 1, f"{name}: {ulps} ulp"


def assert_case(name: str, case: dict, got, want) -> None:
    if isinstance(want, tuple):  # (norm(x + residual), x + residual): the sum is rounded once, as PyTorch's
        assert torch.equal(got[1], want[1]), f"{name}: residual sum"
        got, want = got[0], want[0]
    assert_close(name, got, want, case)


# ------------------------------------------------------------------------------- Triton interpreter (CPU)
@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    """Every case's Triton result, run in one subprocess under the Triton interpreter."""
    pytest.importorskip("triton")
    return run_cases_in_triton_interpreter("tests.kernels.fused_cases", CASES, tmp_path_factory.mktemp("fused_ops"))


@pytest.mark.parametrize("name", list(CASES))
def test_triton_kernel_matches_pytorch_in_interpreter(name, interpreted):
    case = CASES[name]
    assert_case(name, case, interpreted[name], run(case, TORCH_OPS))


# ----------------------------------------------------------------------------------- compiled, on CUDA
@pytest.fixture(scope="module")
def cuda_cases() -> dict:
    pytest.importorskip("triton")
    return make_cases("cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_triton_kernel_matches_pytorch_on_cuda(name, cuda_cases):
    case = cuda_cases[name]
    assert fused_ops._triton_ops() is not None
    assert_case(name, case, run(case, fused_ops), run(case, TORCH_OPS))


@pytest.mark.gpu
def test_kernels_replay_in_a_cuda_graph(cuda_cases):
    """Captured after a warm-up (which compiles them), the kernels read new inputs on replay."""
    new = dict(device="cuda", dtype=torch.bfloat16)
    x, r, w = torch.randn(4, 1024, **new), torch.randn(4, 1024, **new), torch.randn(1024, **new)
    gu = torch.randn(4, 2048, **new)
    case = cuda_cases["rotary-d128-q16-kv8-t5-norm-bf16"]
    qkv = case["qkv"].clone()

    def step():
        out, s = fused_ops.rms_norm(x, w, 1e-6, r)
        fused_ops.rotary_embedding(
            case["positions"], *qk_views(case, qkv), case["cos"], case["sin"], case["q_norm"], case["k_norm"]
        )
        return out, s, fused_ops.silu_and_mul(gu)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step()
    for src in (x, r, gu):
        src.copy_(torch.randn_like(src))
    qkv.copy_(case["qkv"])
    graph.replay()
    torch.cuda.synchronize()
    want = TORCH_OPS.rms_norm(x, w, 1e-6, r)
    assert torch.equal(outs[1], want[1])
    assert int((_ordered(outs[0]) - _ordered(want[0])).abs().max()) <= 1
    assert torch.equal(qkv, run(case, fused_ops))
    assert torch.equal(outs[2], TORCH_OPS.silu_and_mul(gu))


# ---------------------------------------------------------------------------------------- dispatch, layers
def test_cpu_tensors_take_the_pytorch_path_without_importing_triton():
    code = (
        "import sys, torch\nfrom attnserve.layers.norm import RMSNorm\n"
        "from attnserve.layers.activation import SiluAndMul\nfrom attnserve.layers.rotary import RotaryEmbedding\n"
        "x = torch.randn(3, 64)\nRMSNorm(64)(x, x)\nSiluAndMul()(x)\n"
        "q = torch.randn(3, 2, 64)\nRotaryEmbedding(64, 16, 1e4)(torch.arange(3), q, q.clone())\n"
        "print('triton' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_cpu_dispatch_is_the_pytorch_definition(dtype):
    for name, case in CASES.items():
        if name.endswith(dtype):
            got, want = run(case, fused_ops), run(case, TORCH_OPS)
            for g, w in zip(*((got, want) if isinstance(got, tuple) else ((got,), (want,)))):
                assert torch.equal(g, w), name


def test_rms_norm_module_with_residual_returns_norm_of_sum_and_sum():
    from attnserve.layers.norm import RMSNorm

    norm = RMSNorm(576, 1e-5).to(torch.bfloat16)
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.1)
    x, r = torch.randn(3, 576, dtype=torch.bfloat16), torch.randn(3, 576, dtype=torch.bfloat16)
    out, s = norm(x, r)
    assert torch.equal(s, r + x) and torch.equal(out, norm(r + x))


def test_rotary_rotates_in_place_and_leaves_v_alone():
    from attnserve.layers.rotary import RotaryEmbedding

    case = CASES["rotary-d64-q8-kv2-t11-nonorm-bf16"]
    qkv = case["qkv"].clone()
    q, k = qk_views(case, qkv)
    rope = RotaryEmbedding(64, 1024, 1e6)
    q2, k2 = rope(case["positions"], q, k)
    assert q2 is q and k2 is k
    assert torch.equal(qkv, run(case, TORCH_OPS))
    assert torch.equal(qkv[:, -2 * 64 :], case["qkv"][:, -2 * 64 :])
    assert not torch.equal(qkv[:, : 8 * 64], case["qkv"][:, : 8 * 64])


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_residual_passing_is_bit_identical_to_hf_order(arch, tiny_model_dir):
    """The decoder stack with fused residual adds equals ``h = h + attn(norm(h)); h = h + mlp(norm(h))``
    computed with the same modules, bit for bit (CPU, bfloat16)."""
    from attnserve import LLM, SamplingParams
    from attnserve.engine.scheduler import ScheduledRequest, SchedulerOutput

    llm = LLM(tiny_model_dir(arch), dtype="bfloat16", device="cpu", attention_backend="CPU_ATTN")
    runner, model = llm.engine.runner, llm.engine.runner.model
    prompt = list(range(100, 120))
    req = ScheduledRequest("r", prompt, 0, [0, 1], SamplingParams(max_tokens=1), True)
    batch = runner.prepare(SchedulerOutput(requests=[req]))
    with torch.inference_mode():
        got = model(batch.input_ids, batch.positions, batch)
        h = model.embed_tokens(batch.input_ids)
        for layer in model.layers:
            h = h + layer.self_attn(batch.positions, layer.input_layernorm(h), batch)
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        want = model.norm(h)
    assert torch.equal(got, want)
