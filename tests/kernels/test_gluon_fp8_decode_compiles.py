"""The Gluon fp8 decode kernel (``attnserve/kernels/gluon_fp8_decode.py``) builds for an H100/H200 (sm_90) without a
GPU: Triton compiles it ahead of time to a cubin with its bundled ``ptxas``, and ``cuobjdump`` reports the registers,
stack and local memory of the result and its SASS. Built in a process of its own without ``TRITON_INTERPRET``
(``python -m tests.kernels.test_gluon_fp8_decode_compiles IN OUT``, as ``triton_attention_sm90.py`` does for the
Triton kernels). Skips where Triton has no Gluon or its NVIDIA backend lacks ``ptxas`` or ``cuobjdump``.

Checked: no spills (no stack, no local memory), shared memory within sm_90's per-block limit, and what the kernel
is for: K and V leave shared memory through ``ldmatrix`` and 16-byte loads (no byte loads, ``LDS.U8``) and the
copies are ``cp.async`` (``LDGSTS``). The default config must also fit 4 programs an SM (registers and shared
memory): the issue's batch-64 x 8-KV-head grid is 512 programs on 132 SMs. Nothing here runs on a GPU, so nothing
here says anything about speed or correctness.
"""

from __future__ import annotations

import re
import sys

import pytest
import torch

from tests.helpers import run_cases_in_subprocess

# (head, query heads per KV head, page, block_n, num_stages, num_warps, kv, k_width); the first is the default
VARIANTS = [
    (128, 4, 16, 64, 2, 4, "fp8e4nv", 4),  # Llama-3 8B batch-64 decode (issue 26)
    (128, 4, 16, 64, 2, 4, "fp8e5", 4),  # e5m2
    (128, 4, 16, 64, 3, 4, "fp8e4nv", 4),
    (128, 4, 16, 64, 4, 4, "fp8e4nv", 4),
    (128, 4, 16, 64, 3, 4, "fp8e4nv", 2),  # K through 16-bit shared loads
    (128, 4, 16, 32, 4, 4, "fp8e4nv", 4),  # fewer tokens than warps x 16: the compiler's max
    (128, 4, 16, 128, 2, 8, "fp8e4nv", 4),
    (128, 2, 16, 64, 3, 4, "fp8e4nv", 4),  # Qwen3
    (128, 8, 16, 64, 3, 4, "fp8e4nv", 4),  # the widest query group
    (128, 1, 64, 64, 3, 4, "fp8e4nv", 4),  # MHA, 64-token pages
    (64, 3, 16, 64, 3, 4, "fp8e4nv", 4),  # SmolLM2's head 64
    (256, 4, 16, 32, 3, 4, "fp8e4nv", 4),  # head 256
]
KEYS = ("head", "qpkv", "page", "block_n", "num_stages", "num_warps", "kv", "k_width")
SM90_SHARED_LIMIT = 227 * 1024  # per block
SM90_SHARED_PER_SM = 228 * 1024  # of which each resident block also takes 1 KB


def compile_sm90(head, qpkv, page, block_n, num_stages, num_warps, kv, k_width) -> tuple[dict, int, str]:
    """``_gluon_fp8_decode_kernel`` compiled for sm_90 as ``gluon_fp8_decode_attention`` launches it (bf16 query and
    output, no FP contraction; pointers and integer strides divisible by 16, as the launcher finds them). Returns
    (cuobjdump's resource usage, shared memory bytes, SASS)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from attnserve.kernels import gluon_fp8_decode as g
    from tests.kernels.triton_attention_sm90 import _inspect

    fn = g._gluon_fp8_decode_kernel
    names = list(fn.arg_names)
    const = dict(NUM_QPKV=qpkv, HEAD=head, PAGE=page, BLOCK_N=block_n, NUM_STAGES=num_stages, K_WIDTH=k_width)
    pointers = dict(out_ptr="*bf16", q_ptr="*bf16", k_ptr=f"*{kv}", v_ptr=f"*{kv}", bt_ptr="*i32", seq_lens_ptr="*i32")
    floats = ("scale", "k_scale", "v_scale")
    sig = {n: "constexpr" if n in const else pointers.get(n) or ("fp32" if n in floats else "i32") for n in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if sig[n] not in ("constexpr", "fp32")}
    src = GluonASTSource(fn, sig, constexprs={(names.index(k),): v for k, v in const.items()}, attrs=attrs)
    options = dict(num_warps=num_warps, enable_fp_fusion=False)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    resources, sass = _inspect(kernel, asm=True)
    return resources, kernel.metadata.shared, sass


def sass_counts(sass: str) -> dict[str, int]:
    """Shared-memory and copy instructions in the whole kernel."""
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass)
    return {
        "LDS.U8": sum(op.startswith(("LDS.U8", "LDS.S8")) for op in ops),
        "LDSM": sum(op.startswith("LDSM") for op in ops),
        "LDS.128": sum(op == "LDS.128" for op in ops),
        "LDGSTS": sum(op.startswith("LDGSTS") for op in ops),
        "HMMA": sum(op.startswith("HMMA") for op in ops),
    }


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> list:
    pytest.importorskip("triton")
    from attnserve.kernels.gluon_fp8_decode import available
    from tests.kernels.triton_attention_sm90 import _tool

    if not available():
        pytest.skip("needs triton.experimental.gluon")
    if _tool("ptxas") is None or _tool("cuobjdump") is None:
        pytest.skip("needs Triton's NVIDIA backend with ptxas and cuobjdump")
    variants = [dict(zip(KEYS, v)) for v in VARIANTS]
    folder = tmp_path_factory.mktemp("gluon_sm90")
    return run_cases_in_subprocess(
        "tests.kernels.test_gluon_fp8_decode_compiles", variants, folder, interpret=False, timeout=900
    )


@pytest.mark.parametrize("index", range(len(VARIANTS)), ids=["-".join(map(str, v)) for v in VARIANTS])
def test_gluon_fp8_decode_builds_for_sm90_without_spills(index, built):
    res, shared, counts = built[index]
    print(f"{dict(zip(KEYS, VARIANTS[index]))}: {res['REG']} registers, {shared} B shared, SASS {counts}")
    assert res["REG"] <= 255 and res["STACK"] == 0 and res["LOCAL"] == 0, res
    assert shared <= SM90_SHARED_LIMIT, shared
    assert counts["LDS.U8"] == 0 and counts["LDSM"] > 0 and counts["LDGSTS"] > 0 and counts["HMMA"] > 0, counts


def test_default_config_fits_four_programs_an_sm(built):
    from attnserve.kernels import gluon_fp8_decode as g

    assert VARIANTS[0][3:6] == (g.BLOCK_N, g.NUM_STAGES, g.NUM_WARPS)
    res, shared, _ = built[0]
    assert res["REG"] * 32 * g.NUM_WARPS * 4 <= 65536, res  # 4 programs' registers
    assert 4 * (shared + 1024) <= SM90_SHARED_PER_SM, shared


def main(inp: str, out: str) -> None:
    """Each variant: ``compile_sm90``'s keyword arguments; writes (resources, shared bytes, SASS counts) each."""
    import triton

    assert not triton.knobs.runtime.interpret, "run without TRITON_INTERPRET"
    results = []
    for variant in torch.load(inp):
        res, shared, sass = compile_sm90(**variant)
        results.append((res, shared, sass_counts(sass)))
    torch.save(results, out)


if __name__ == "__main__":
    main(*sys.argv[1:3])
