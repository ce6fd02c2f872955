"""TRITON_ATTN's paged-attention kernel (``attnserve/kernels/triton_attention.py``) against the
plain-PyTorch oracle (``attnserve/kernels/reference.py``) under the Triton interpreter.

``python -m tests.kernels.triton_attention_interpreted IN OUT`` with ``TRITON_INTERPRET=1`` (the interpreter
mode is fixed when Triton's kernels are decorated, hence a process of its own; ``tests.helpers.
run_cases_in_triton_interpreter`` starts it): IN holds ``{name: op case fields}`` and ``{name: backend case
fields}``, OUT gets ``{name: {"out": kernel output, "ref": oracle output, ...}}``.

Two kinds of case:

- ``op``: ``paged_attention`` called directly on a batch built here, so that every knob the KV tiling
  touches is set explicitly: context lengths around the tile size, page size, query heads per KV head,
  ``num_splits``, ``pages_per_tile``, sliding window, soft cap, an fp8 cache with scales, and block tables
  whose physical block ids are shuffled and whose unused entries (and the columns just past the table's
  width) hold block ids far outside the cache, so that a read of an entry the request does not own shows;
- ``backend``: one step of ``TritonAttentionBackend`` (builder + impl, which writes this step's K/V) on a
  named shape of ``tests/gpu/cases.py`` (``run_case``, the GPU tests' harness), with builder attributes
  (``num_sms``) that make its split-KV choice what a GPU's would be.
"""

from __future__ import annotations

import sys

import torch

from attnserve.kernels.reference import reference_paged_attention

# block id written where a request owns no block: any load through it would leave the cache's allocation
FAR_BLOCK = 1 << 24


def bf16_dot_is_exact() -> bool:
    """Whether the installed Triton interpreter's ``tl.dot`` of bfloat16 operands is right (on a 16 x 16
    product of small integers, exact in any precision)."""
    import triton
    import triton.language as tl

    @triton.jit
    def dot16(a_ptr, b_ptr, c_ptr):
        r = tl.arange(0, 16)
        a = tl.load(a_ptr + r[:, None] * 16 + r[None, :])
        b = tl.load(b_ptr + r[:, None] * 16 + r[None, :])
        tl.store(c_ptr + r[:, None] * 16 + r[None, :], tl.dot(a, b))

    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randint(-2, 3, (16, 16), generator=gen).to(torch.bfloat16) for _ in range(2))
    c = torch.zeros(16, 16)
    dot16[(1,)](a, b, c)
    return torch.equal(c, a.float() @ b.float())


def fix_interpreter_bf16_dot() -> bool:
    """Make the interpreter's ``tl.dot`` compute bfloat16 operands by value; returns whether it was needed.

    The interpreter stores bfloat16 as its uint16 bit pattern and its ``create_dot`` converts only 8-bit
    float operands before ``np.matmul``, so a bfloat16 dot multiplies bit patterns (values ~1e10; Triton
    issue #11584, "not supported yet"; Triton 3.9 here). The kernel's other bfloat16 steps (loads, stores,
    casts to and from float32) are right. This widens bfloat16 operands to float32 (exact: bf16 is the top
    half of an fp32) and accumulates in the accumulator's float32, as the GPU's MMA does. Installed only
    when ``bf16_dot_is_exact`` says the installed interpreter gets it wrong."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    if bf16_dot_is_exact():
        return False
    original = interpreter.InterpreterBuilder.create_dot

    def widen(x):
        if x.dtype == tl.bfloat16:
            return interpreter.TensorHandle((x.data.astype(np.uint32) << np.uint32(16)).view(np.float32), tl.float32)
        return x

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return original(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    interpreter.InterpreterBuilder.create_dot = create_dot
    assert bf16_dot_is_exact()
    return True


def build_op_case(
    reqs: list[tuple[int, int]],
    page: int,
    num_heads: int,
    num_kv_heads: int,
    head: int,
    dtype: torch.dtype,
    kv_fp8: bool | str = False,
    seed: int = 0,
) -> dict:
    """Inputs of one ``paged_attention`` call over requests ``(context_len, query_len)``.

    Cache ``(num_blocks, 2, page, Hkv, D)`` (TRITON_ATTN's shape) filled with N(0, 2^2) values (fp8:
    stored as ``x / scale``, e4m3); block table ``(B, W)`` int32, W = the longest request's page count,
    a view of a wider tensor whose extra columns and each row's unused entries hold ``FAR_BLOCK``;
    physical blocks are a random permutation (a few spare blocks belong to no request). ``kv_fp8="e5m2"``:
    an e5m2 cache."""
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [c + q for c, q in reqs]
    blocks_per = [-(-s // page) for s in seq_lens]
    num_blocks = sum(blocks_per) + 3
    perm = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    width = max(blocks_per)
    wide = torch.full((len(reqs), width + 4), FAR_BLOCK, dtype=torch.int32)
    at = 0
    for i, n in enumerate(blocks_per):
        wide[i, :n] = perm[at : at + n]
        at += n
    block_table = wide[:, :width]
    kv_dtype = (torch.float8_e5m2 if kv_fp8 == "e5m2" else torch.float8_e4m3fn) if kv_fp8 else dtype
    k_scale, v_scale = (10.0 / 448.0, 12.0 / 448.0) if kv_fp8 else (1.0, 1.0)
    cache = torch.randn(num_blocks, 2, page, num_kv_heads, head, generator=gen) * 2
    cache[:, 0] /= k_scale
    cache[:, 1] /= v_scale
    cache = cache.to(kv_dtype)
    T = sum(q for _, q in reqs)
    query = (torch.randn(T, num_heads, head, generator=gen) * 2).to(dtype)
    qsl = torch.zeros(len(reqs) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(torch.tensor([q for _, q in reqs]), 0)
    return dict(
        query=query,
        cache=cache,
        block_table=block_table,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        query_start_loc=qsl,
        k_scale=k_scale,
        v_scale=v_scale,
    )


def run_op_case(fields: dict, device: str = "cpu", oracle: torch.dtype = torch.float32) -> dict:
    """``paged_attention`` (under the interpreter; on a GPU with ``device="cuda"``) and the oracle (in
    ``oracle`` arithmetic) on one op case's inputs."""
    from attnserve.kernels.triton_attention import block_m_for, paged_attention, query_tiles

    f = dict(fields)
    x = build_op_case(
        f.pop("reqs"),
        f.pop("page"),
        f["num_heads"],
        f["num_kv_heads"],
        f["head"],
        getattr(torch, f.pop("dtype")),
        f.pop("kv_fp8", False),
        f.pop("seed", 0),
    )
    x = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in x.items()}
    query, cache, table = x["query"], x["cache"], x["block_table"]
    key_cache, value_cache = cache[:, 0], cache[:, 1]
    scale = f["head"] ** -0.5
    window, softcap = f.get("window"), f.get("softcap")
    block_m, block_q = block_m_for(f["num_heads"] // f["num_kv_heads"], f.get("block_m", 16))
    tile_seq, tile_start = (t.to(device) for t in query_tiles(x["query_start_loc"].cpu(), block_q))
    ordered = f.get("ordered", False)  # decode tiles longest first, a request's KV heads together
    if ordered:
        tile_seq = x["seq_lens"].argsort(descending=True).to(torch.int32)
    out = torch.full_like(query, float("nan"))
    paged_attention(
        out,
        query,
        key_cache,
        value_cache,
        table,
        x["seq_lens"],
        x["query_start_loc"],
        tile_seq,
        tile_start,
        scale,
        num_splits=f.get("num_splits", 1),
        sliding_window=window,
        logits_soft_cap=softcap,
        k_scale=x["k_scale"],
        v_scale=x["v_scale"],
        pages_per_tile=f.get("pages_per_tile"),
        fp8_dot=f.get("fp8_dot"),
        block_m=block_m,
        decode=ordered,
        ordered=ordered,
    )
    ref_cache = torch.stack([key_cache.to(oracle) * x["k_scale"], value_cache.to(oracle) * x["v_scale"]])
    ref = reference_paged_attention(
        query.to(oracle),
        ref_cache,
        x["query_start_loc"],
        x["seq_lens"],
        table,
        scale,
        sliding_window=window,
        logits_soft_cap=softcap,
    )
    return {"out": out, "ref": ref}


def run_backend_case(fields: dict) -> dict:
    """One step of TRITON_ATTN on a named shape (``tests.gpu.cases.run_case``); its error row and the
    split count the builder chose for each kernel call."""
    from attnserve.attention.backend import KVCacheLayout
    from attnserve.attention.backends.triton_attn import TritonAttentionBackend
    from tests.gpu.cases import Case, run_case

    f = dict(fields)
    small = f.pop("small", True)
    builder_attrs = f.pop("builder_attrs", None)
    f["dtype"] = getattr(torch, f["dtype"])
    if "layout" in f:
        f["layout"] = KVCacheLayout(f["layout"])
    captured: dict = {}
    row = run_case(
        TritonAttentionBackend, Case(**f), "cpu", small=small, builder_attrs=builder_attrs, captured=captured
    )
    row["splits"] = [call.num_splits for call in captured["metadata"].calls]
    return row


def main(inp: str, out: str) -> None:
    import triton

    assert triton.knobs.runtime.interpret, "run with TRITON_INTERPRET=1"
    cases = torch.load(inp)
    results = {"bf16_dot_fixed": fix_interpreter_bf16_dot()}
    for name, fields in cases.get("op", {}).items():
        results[name] = run_op_case(fields)
    for name, fields in cases.get("backend", {}).items():
        results[name] = run_backend_case(fields)
    torch.save(results, out)


if __name__ == "__main__":
    main(*sys.argv[1:3])
