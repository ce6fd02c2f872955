"""The fused RoPE + paged-KV-cache write (``rotary_embedding_kv_write``): its Triton kernel against the two
kernels it replaces (``_rope_kernel``, then ``reshape_and_cache``), bitwise, under the Triton interpreter;
the slots it writes against the PyTorch KV write; and the dispatch (PyTorch ops elsewhere than CUDA).

On CUDA the compiled kernel gets the same comparison in ``tests/gpu/test_rope_kv_write_gpu.py``.
"""

from __future__ import annotations

import pytest
import torch

from attnserve.kernels.kv_write import write_kv_torch
from attnserve.kernels import fused_ops
from tests.helpers import run_cases_in_triton_interpreter
from tests.kernels.rope_kv_cases import make_cases, run, views

CASES = make_cases()


def bits(x: torch.Tensor) -> torch.Tensor:
    """``x``'s bytes as integers (fp8 included, which ``torch.equal`` does not compare everywhere)."""
    return x.contiguous().view(torch.uint8)


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    """Every case through the fused kernel and through the two kernels, in one interpreter subprocess."""
    pytest.importorskip("triton")
    return run_cases_in_triton_interpreter("tests.kernels.rope_kv_cases", CASES, tmp_path_factory.mktemp("rope_kv"))


@pytest.mark.parametrize("name", list(CASES))
def test_fused_kernel_equals_rope_then_reshape_and_cache(name, interpreted):
    """q and k rotated in place (v untouched) and the whole cache (written slots and the others) bit for bit."""
    (qkv, *caches), (qkv_two, *caches_two) = interpreted[name]["fused"], interpreted[name]["two"]
    assert torch.equal(qkv, qkv_two)
    for cache, cache_two, given in zip(caches, caches_two, CASES[name]["caches"], strict=True):
        assert cache.stride() == given.stride()  # the case's layout survived the round trip
        assert torch.equal(bits(cache), bits(cache_two))


@pytest.mark.parametrize("name", list(CASES))
def test_fused_kernel_writes_rotated_k_and_v_at_their_slots(name, interpreted):
    """Against the PyTorch KV write of the kernel's own rotated k: the slot arithmetic, the strides of each
    cache shape and layout, slot -1 skipped (the junk there kept), v unrotated, fp8 as ``x / scale``."""
    case = CASES[name]
    qkv, *caches = interpreted[name]["fused"]
    _, k, v, _ = views(case, qkv, caches)
    want = tuple(c.clone() for c in case["caches"])
    target = views(case, case["qkv"], want)[3]
    write_kv_torch(k, v, target.key_cache, target.value_cache, target.slot_mapping, target.k_scale, target.v_scale)
    assert torch.equal(v, views(case, case["qkv"], want)[2])  # v is not touched in place
    if want[0].dtype.itemsize > 1:
        assert all(torch.equal(c, w) for c, w in zip(caches, want))
        return
    # fp8: every slot that is not written keeps its bytes; the written values are PyTorch's up to the Triton
    # interpreter's float32 -> e4m3 cast, which does not round to nearest even (29 -> 30, PyTorch 28) and
    # loses the carry into the exponent (31.9 -> 16, PyTorch 32): one e4m3 step (1/8 of the value), or half
    stored = tuple(torch.zeros(w.shape, dtype=torch.bool) for w in want)
    written = views(case, qkv, stored)[3]
    live = target.slot_mapping[target.slot_mapping >= 0]
    page = written.key_cache.shape[1]
    written.key_cache[live // page, live % page] = True
    written.value_cache[live // page, live % page] = True
    for cache, w, s in zip(caches, want, stored):
        assert torch.equal(bits(cache)[~s], bits(w)[~s])
        got, ref = cache.float()[s], w.float()[s]
        assert bool((((got - ref).abs() <= ref.abs() / 8 + 2.0**-9) | (got == ref / 2)).all())


@pytest.mark.parametrize("name", [n for n in CASES if not n.startswith("fp8")])
def test_cpu_dispatch_is_rotary_then_the_pytorch_kv_write(name):
    """On CPU tensors ``rotary_embedding_kv_write`` is exactly ``rotary_embedding_torch`` then the PyTorch
    KV write: what the unfused path computes."""
    case = CASES[name]
    qkv, caches = case["qkv"].clone(), tuple(c.clone() for c in case["caches"])
    q, k, v, target = views(case, qkv, caches)
    fused_ops.rotary_embedding_kv_write(
        case["positions"], q, k, v, case["cos"], case["sin"], target, case["q_norm"], case["k_norm"]
    )
    want_qkv, *want_caches = run(case, "torch")
    assert torch.equal(qkv, want_qkv) and all(torch.equal(c, w) for c, w in zip(caches, want_caches, strict=True))
