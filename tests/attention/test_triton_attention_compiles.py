"""TRITON_ATTN's paged-attention kernel builds for an H100/H200 (sm_90) without a GPU: Triton compiles it
ahead of time to a cubin with its bundled ``ptxas``, and ``cuobjdump -res-usage`` reports the registers,
stack and local memory of the result.

The interpreter (``test_triton_attention_vs_reference.py``) runs the kernel's Python; this checks what the
interpreter cannot: that the GPU compiler accepts the KV-tile variants the host picks
(``default_pages_per_tile``) and that they neither spill (no stack, no local memory) nor pass 64 KB of
shared memory (``KV_TILE_BYTES``'s aim: sm_75's per-block limit). Nothing here runs on a GPU, so nothing
here says anything about speed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

triton = pytest.importorskip("triton")

BF16, FP32 = "bf16", "fp32"


def _tool(name: str) -> str | None:
    from triton.backends.nvidia import compiler

    bundled = os.path.join(os.path.dirname(compiler.__file__), "bin", name)
    return bundled if os.path.exists(bundled) else shutil.which(name)


pytestmark = pytest.mark.skipif(_tool("ptxas") is None or _tool("cuobjdump") is None,
                                reason="needs Triton's NVIDIA backend with ptxas and cuobjdump")


def compile_sm90(dtype: str, head: int, qpkv: int, page: int, num_splits: int, window: bool = False,
                 pages_per_tile: int | None = None) -> tuple[dict, int]:
    """``_paged_attention_kernel`` compiled for sm_90 with the constants ``paged_attention`` would pass
    (pointers and strides specialised as divisible by 16, as the launcher does for such arguments).
    Returns (cuobjdump's resource usage: {"REG": n, "STACK": n, "LOCAL": n, ...}, shared memory bytes)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from attnserve.attention.ops import triton_attention as ta

    fn = ta._paged_attention_kernel
    names = list(fn.arg_names)
    block_m, block_q = ta.block_m_for(qpkv)
    head_pad = max(16, triton.next_power_of_2(head))
    elem = 4 if dtype == FP32 else 2
    ppt = pages_per_tile or ta.default_pages_per_tile(page, head_pad, elem)
    const = dict(NUM_QPKV=qpkv, BLOCK_Q=block_q, BLOCK_M=block_m, HEAD=head, HEAD_PAD=head_pad, PAGE=page,
                 PAGES_PER_TILE=ppt, NUM_SPLITS=num_splits, USE_SOFTCAP=False, USE_WINDOW=window, KV_FP8=False,
                 PREC="ieee" if dtype == FP32 else None)
    data = {"out_ptr", "q_ptr", "k_ptr", "v_ptr"}
    sig = {}
    for n in names:
        if n in const:
            sig[n] = "constexpr"
        elif n.endswith("_ptr"):
            sig[n] = f"*{dtype}" if n in data else "*fp32" if n.startswith("part_") else "*i32"
        else:
            sig[n] = "fp32" if n in ("scale", "k_scale", "v_scale", "softcap") else "i32"
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in names if n.endswith("_ptr") or n.startswith("stride")}
    src = ASTSource(fn, sig, constexprs={(names.index(k),): v for k, v in const.items()}, attrs=attrs)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32))
    cubin = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"paged_attention_sm90_{os.getpid()}.cubin")
    with open(cubin, "wb") as f:
        f.write(kernel.asm["cubin"])
    try:
        usage = subprocess.run([_tool("cuobjdump"), "-res-usage", cubin], capture_output=True, text=True,
                               check=True).stdout
    finally:
        os.remove(cubin)
    resources = {k: int(v) for k, v in re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", usage)}
    return resources, kernel.metadata.shared


@pytest.mark.parametrize("dtype,head,qpkv,page,num_splits,window", [
    (BF16, 128, 4, 16, 1, False),  # Llama-3 8B, 16-token pages: 4 pages per tile
    (BF16, 128, 2, 16, 16, False),  # Qwen3, split-KV
    (BF16, 128, 4, 32, 1, True),  # 2 pages per tile, sliding window
    (BF16, 128, 4, 64, 1, False),  # one page per tile (the scalar block-id path)
    (BF16, 256, 4, 16, 1, False),  # head 256: 32-token tiles
    (FP32, 128, 4, 16, 4, False),  # float32 (ieee dot): 32-token tiles
    (FP32, 256, 4, 16, 1, False),  # float32 head 256: one page per tile
])
def test_kernel_builds_for_sm90_without_spills(dtype, head, qpkv, page, num_splits, window):
    res, shared = compile_sm90(dtype, head, qpkv, page, num_splits, window)
    assert res["REG"] <= 255 and res["STACK"] == 0 and res["LOCAL"] == 0, res
    assert shared <= 64 * 1024, shared
