"""``_paged_attention_kernel`` compiled ahead of time for sm_90 (H100/H200) on a machine without a GPU, and the
resources of the result: ``python -m tests.kernels.triton_attention_sm90 IN OUT`` (IN: a list of variant
dicts, the keyword arguments of ``compile_sm90``; OUT gets one ``(resources, shared bytes)`` per variant).

A process of its own because ``TRITON_INTERPRET=1`` (set for the interpreter tests) makes every
``triton.jit`` function an interpreted one, which ``triton.compile`` cannot build:
``tests/kernels/test_triton_attention_compiles.py`` starts this with the variable removed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile

import torch

FP32 = "fp32"


def _tool(name: str) -> str | None:
    from triton.backends.nvidia import compiler

    bundled = os.path.join(os.path.dirname(compiler.__file__), "bin", name)
    return bundled if os.path.exists(bundled) else shutil.which(name)


def _signature(names: list[str], const: dict, dtype: str, rope: bool, kv: str | None = None) -> tuple[dict, dict, dict]:
    """The kernel's signature (its tuple arguments' members typed as ``paged_attention`` passes them) and the
    launcher's specialisation: every pointer and stride divisible by 16, as the launcher finds them; and
    ``rope_args`` None (a constexpr) without ``rope``. Returns (signature, attrs, constexprs by path)."""
    heads = (f"*{dtype}", "i32", "i32")  # (ptr, stride_t, stride_h)
    cache = (f"*{kv or dtype}", "i32", "i32", "i32", "fp32")  # (ptr, stride_b, stride_s, stride_h, fp8 scale)
    rope_args = (
        heads,
        heads,
        heads,
        ("*i64", "*fp32", "*fp32", "i32", f"*{dtype}", "fp32", f"*{dtype}", "fp32"),
        ("*i64", cache, cache, "fp32"),
    )
    tuples = dict(
        out_heads=heads,
        q_heads=heads,
        kc=cache,
        vc=cache,
        bt=("*i32", "i32"),
        step=("*i32",) * 4,
        parts=("*fp32", "*fp32"),
        scores=("fp32", "fp32", "i32"),
        rope_args=rope_args if rope else "constexpr",
    )
    sig = {n: "constexpr" if n in const else tuples.get(n, "*i32" if n.endswith("_ptr") else "i32") for n in names}
    const_paths = {} if rope else {(names.index("rope_args"),): None}
    attrs = {}

    def mark(path: tuple, ty) -> None:
        if isinstance(ty, tuple):
            for i, member in enumerate(ty):
                mark((*path, i), member)
        elif ty.startswith("*") or ty == "i32":
            attrs[path] = [["tt.divisibility", 16]]

    for i, n in enumerate(names):
        if n == "sinks_ptr" or (isinstance(sig[n], tuple) and n != "scores"):
            mark((i,), sig[n])
    return sig, attrs, const_paths


def compile_sm90(
    dtype: str,
    head: int,
    qpkv: int,
    page: int,
    num_splits: int,
    window: bool = False,
    pages_per_tile: int | None = None,
    rope: bool = False,
    decode: bool = False,
    kv: str | None = None,
    fp8_dot: str | None = None,
    launch: dict | None = None,
    asm: bool = False,
    block_m: int = 16,
    causal: bool = True,
    part_slots: int | None = None,
    part_base: int = 0,
    fold_slots: int = 0,
    ordered: bool = False,
) -> tuple:
    """``_paged_attention_kernel`` compiled for sm_90 with the constants and launch options ``paged_attention``
    would get from TRITON_ATTN's builder on an H200 (PDL on, no FP contraction; pointers and strides
    specialised as divisible by 16, as the launcher does for such arguments). ``decode``: a decode call, with
    the builder's decode launch options (``triton_attn_plan._DECODE_LAUNCH``: 2 stages, and 8 warps when the KV is
    split; the builder splits only decode calls); ``rope``: with RoPE + q/k norm + the KV write inside
    (``DecodeRope``; 8 KV heads), a decode call. ``kv``: an fp8 cache ("fp8e4nv" or "fp8e5") read the
    ``fp8_dot`` way (None: ``default_fp8_dot``), with the builder's fp8 decode launch options; ``launch``:
    launch options instead of the builder's; ``asm``: the SASS too (``cuobjdump -sass``); ``block_m``: query
    rows of a tile (``paged_attention(block_m=)``); ``causal``, ``part_slots`` (None: ``num_splits``), ``part_base``,
    ``fold_slots``: ``paged_attention(causal=, parts=, part_base=, fold=)``, a cascade's calls; ``ordered``: a decode
    call's ``paged_attention(ordered=True)``.
    Returns (cuobjdump's resource usage: {"REG": n, "STACK": n, "LOCAL": n, ...}, shared memory bytes[, SASS])."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from attnserve.kernels import triton_attention as ta
    from attnserve.kernels.triton_attention_kernel import _paged_attention_kernel

    fn = _paged_attention_kernel
    names = list(fn.arg_names)
    block_m, block_q = ta.block_m_for(qpkv, block_m)
    head_pad = max(16, triton.next_power_of_2(head))
    elem = 4 if dtype == FP32 else 2
    ppt = pages_per_tile or ta.default_pages_per_tile(page, head_pad, elem, kv_elem_bytes=1 if kv else elem)
    hk = 8
    const = dict(
        NUM_QPKV=qpkv,
        BLOCK_Q=block_q,
        BLOCK_M=block_m,
        HEAD=head,
        HEAD_PAD=head_pad,
        PAGE=page,
        PAGES_PER_TILE=ppt,
        NUM_SPLITS=num_splits,
        USE_SOFTCAP=False,
        USE_WINDOW=window,
        KV_FP8=kv is not None,
        FP8_DOT=(fp8_dot or ta.default_fp8_dot(torch.float32 if dtype == FP32 else torch.bfloat16)) if kv else "scaled",
        PREC="ieee" if dtype == FP32 else None,
        USE_PDL=True,
        ROPE=rope,
        HQ=hk * qpkv if rope else 1,
        HQ_PAD=triton.next_power_of_2(hk * qpkv) if rope else 1,
        HK=hk if rope else 1,
        HK_PAD=hk if rope else 1,
        HALF=head // 2 if rope else 1,
        HALF_PAD=triton.next_power_of_2(head // 2) if rope else 1,
        HAS_NORM=rope,
        ROUND_Q=rope,
        ROUND_K=rope,
        INTERPRET=False,
        DECODE=decode,
        USE_SINKS=False,
        CAUSAL=causal,
        PART_SLOTS=(num_splits if num_splits > 1 else 0) if part_slots is None else part_slots,
        PART_BASE=part_base,
        FIRST_STAGE=ta.first_stage(block_m, window),
        FOLD_SLOTS=fold_slots,
        ORDERED=ordered,
    )
    sig, attrs, const_paths = _signature(names, const, dtype, rope, kv)
    constexprs = {(names.index(k),): v for k, v in const.items()} | const_paths
    src = ASTSource(fn, sig, constexprs=constexprs, attrs=attrs)
    from attnserve.attention.backends.triton_attn_plan import _DECODE_LAUNCH, _FP8_DECODE_LAUNCH

    if launch is None:
        launch = (_FP8_DECODE_LAUNCH if kv else _DECODE_LAUNCH)[num_splits > 1] if decode or rope else {}
    options = dict(enable_fp_fusion=False, launch_pdl=True, **launch)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    resources, sass = _inspect(kernel, asm)
    return (resources, kernel.metadata.shared, sass) if asm else (resources, kernel.metadata.shared)


def _inspect(kernel, asm: bool = False) -> tuple[dict, str | None]:
    """cuobjdump's resource usage of a compiled kernel ({"REG": n, "STACK": n, "LOCAL": n, ...}) and, with
    ``asm``, its SASS (else None)."""
    with tempfile.TemporaryDirectory() as folder:
        cubin = os.path.join(folder, "kernel.cubin")
        with open(cubin, "wb") as f:
            f.write(kernel.asm["cubin"])
        usage = subprocess.run(
            [_tool("cuobjdump"), "-res-usage", cubin], capture_output=True, text=True, check=True
        ).stdout
        sass = (
            subprocess.run([_tool("cuobjdump"), "-sass", cubin], capture_output=True, text=True, check=True).stdout
            if asm
            else None
        )
    return {k: int(v) for k, v in re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", usage)}, sass


def compile_keys_major_sm90(head: int, qpkv: int, page: int, num_splits: int, kv: str, pv: str = "f16") -> tuple:
    """``triton_fp8_decode._fp8_decode_kernel`` compiled for sm_90 as ``fp8_decode_attention`` launches it (its
    ``BLOCK_N`` and ``LAUNCH``, no FP contraction; pointers and integer strides divisible by 16); ``kv``: "fp8e4nv"
    or "fp8e5". Returns (resource usage, shared memory bytes)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from attnserve.kernels import triton_fp8_decode as kd

    fn = kd._fp8_decode_kernel
    names = list(fn.arg_names)
    const = dict(
        NUM_QPKV=qpkv,
        QROWS=kd.query_rows(qpkv),
        HEAD=head,
        PAGE=page,
        BLOCK_N=kd.BLOCK_N,
        NUM_SPLITS=num_splits,
        PV=pv,
        PROBE="",
        INTERPRET=False,
    )
    pointers = dict(out_ptr="*bf16", q_ptr="*bf16", k_ptr=f"*{kv}", v_ptr=f"*{kv}", bt_ptr="*i32")
    pointers.update(seq_lens_ptr="*i32", part_out="*fp32", part_lse="*fp32")
    tuples = dict(strides_o=("i32",) * 2, strides_q=("i32",) * 2, strides_k=("i32",) * 3, strides_v=("i32",) * 3)
    sig = {n: "constexpr" if n in const else pointers.get(n) or tuples.get(n) or "i32" for n in names}
    sig["scales"] = ("fp32",) * 3
    attrs = {}
    for i, n in enumerate(names):
        if n in pointers or n in ("bt_stride", "num_q_heads"):
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif n in tuples:
            attrs.update({(i, j): [["tt.divisibility", 16]] for j in range(len(tuples[n]))})
    src = ASTSource(fn, sig, constexprs={(names.index(k),): v for k, v in const.items()}, attrs=attrs)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(enable_fp_fusion=False, **kd.LAUNCH))
    return _inspect(kernel)[0], kernel.metadata.shared


def main(inp: str, out: str) -> None:
    """Each variant: ``compile_sm90``'s keyword arguments, or ``compile_keys_major_sm90``'s with ``kernel="keys"``."""
    import triton

    assert not triton.knobs.runtime.interpret, "run without TRITON_INTERPRET"
    results = []
    for variant in torch.load(inp):
        if variant.pop("kernel", None) == "keys":
            results.append(compile_keys_major_sm90(**variant))
        else:
            results.append(compile_sm90(**variant))
    torch.save(results, out)


if __name__ == "__main__":
    main(*sys.argv[1:3])
