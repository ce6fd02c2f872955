"""The symmetric-memory all-reduce's rules that need no GPU: which tensors it takes, when it cannot start, and
that TPGroup's identity ignores it. The all-reduce itself is tested on 2 GPUs (tests/gpu/test_all_reduce_gpu.py)."""

from __future__ import annotations

import pytest
import torch

from attnserve.distributed.group import TPGroup
from attnserve.distributed.symm_mem_all_reduce import MAX_BYTES, SymmMemAllReduce, unavailable_reason, within_limits

LIMIT = 64 * 4096 * 2  # 64 tokens of hidden 4096 in bfloat16


@pytest.mark.parametrize(
    "shape, dtype",
    [((1, 4096), torch.bfloat16), ((64, 4096), torch.bfloat16), ((3, 7, 2), torch.float32), ((2,), torch.bfloat16)],
)
def test_takes_small_contiguous_bf16_and_fp32(shape, dtype):
    assert within_limits(torch.zeros(shape, dtype=dtype), LIMIT)


@pytest.mark.parametrize(
    "x, why",
    [
        (torch.zeros(1, 4096, dtype=torch.float16), "float16: torch's kernel is built for bfloat16 and float32"),
        (torch.zeros(1, 4096, dtype=torch.float64), "float64"),
        (torch.zeros(1, 4096, dtype=torch.int32), "integers"),
        (torch.zeros(65, 4096, dtype=torch.bfloat16), "one row over the limit"),
        (torch.zeros(0, 4096, dtype=torch.bfloat16), "empty"),
        (torch.zeros(3, dtype=torch.bfloat16), "6 bytes: not whole 4-byte words"),
        (torch.zeros(4096, 2, dtype=torch.bfloat16).t(), "not contiguous"),
    ],
)
def test_leaves_other_tensors_to_nccl(x, why):
    assert not within_limits(x, LIMIT), why


def test_limit_is_inclusive():
    x = torch.zeros(64, 4096, dtype=torch.bfloat16)
    assert within_limits(x, x.numel() * 2) and not within_limits(x, x.numel() * 2 - 4)


def test_cpu_tensors_never_taken():
    comm = SymmMemAllReduce(torch.empty(LIMIT, dtype=torch.uint8), "0", 2, LIMIT, fused=True)
    assert not comm.should_use(torch.zeros(1, 4096, dtype=torch.bfloat16))


@pytest.mark.parametrize(
    "device, world_size, words",
    [
        ("cpu", 2, "not a CUDA device"),
        ("cuda:0", 1, "world size 1 is not one of 2..8"),
        ("cuda:0", 9, "world size 9 is not one of 2..8"),
    ],
)
def test_unavailable_reason(device, world_size, words):
    assert words in unavailable_reason(torch.device(device), world_size)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the answer on a machine without CUDA")
def test_unavailable_reason_past_the_shape_checks_without_cuda():
    # reaches the CUDA and torch-version checks (a local ``import torch.x`` there once shadowed ``torch``)
    assert unavailable_reason(torch.device("cuda", 0), 2) == "CUDA is not available"


def test_limits_shrink_with_world_size():
    assert list(MAX_BYTES) == list(range(2, 9))
    assert all(MAX_BYTES[n] >= MAX_BYTES[n + 1] for n in range(2, 8))
    assert MAX_BYTES[2] >= 64 * 4096 * 2  # a 64-token decode step of Llama-3.1-8B (hidden 4096, bfloat16)


def test_tp_group_identity_ignores_the_communicator():
    comm = SymmMemAllReduce(torch.empty(16, dtype=torch.uint8), "0", 2, 16, fused=True)
    with_comm = TPGroup(1, 2, comm)
    assert with_comm == TPGroup(1, 2) and hash(with_comm) == hash(TPGroup(1, 2))
    assert repr(with_comm) == repr(TPGroup(1, 2)) == "TPGroup(rank=1, size=2)"
    assert with_comm.fast_all_reduce is comm and TPGroup(1, 2).fast_all_reduce is None


def test_single_rank_all_reduce_is_identity_even_with_a_communicator():
    comm = SymmMemAllReduce(torch.empty(16, dtype=torch.uint8), "0", 1, 16, fused=True)
    x = torch.ones(2, 2)
    assert TPGroup(0, 1, comm).all_reduce(x) is x
