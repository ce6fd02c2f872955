"""The symmetric-memory all-reduce (attnserve/distributed/symm_mem_all_reduce.py) on 2 GPUs equals NCCL's, bit
for bit, and every rank gets the same bits.

Two spawned ranks (NCCL, the workers' environment: NVLink multicast off). For bfloat16 and float32 and
(1, 2, 8, 64) x 4096 tensors of random values, each rank's own: NCCL's ``dist.all_reduce`` is the reference
(with 2 ranks a + b is the same in any order, so equality is the right test); the symmetric-memory path is
run eagerly (fused copy, separate copy, a misaligned view that takes the unfused path) and replayed from a
CUDA graph of two back-to-back all-reduces with new inputs copied in before each replay. ``TPGroup.all_reduce``
sends a tensor over the limit to NCCL. Needs 2 GPUs; prints one line per case (``-s``).
"""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")]

HIDDEN = 4096
ROWS = (1, 2, 8, 64)
DTYPES = (torch.bfloat16, torch.float32)


def _inputs(rank: int, rows: int, dtype: torch.dtype, device, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * seed + rank)
    return torch.randn(rows, HIDDEN, generator=g).to(dtype).to(device)


def _nccl(x: torch.Tensor) -> torch.Tensor:
    import torch.distributed as dist

    out = x.clone()
    dist.all_reduce(out)
    return out


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.int16 if x.element_size() == 2 else torch.int32)


def _same_on_all_ranks(tp, x: torch.Tensor) -> bool:
    import torch.distributed as dist

    parts = [torch.empty_like(x) for _ in range(tp.size)]
    dist.all_gather(parts, x.contiguous())
    return all(torch.equal(_bits(p), _bits(parts[0])) for p in parts)


def _check_ranks(tp, device) -> list[str]:
    """Runs in every rank; returns rank 0's report lines. Raises AssertionError listing every mismatch."""
    from attnserve.distributed.group import TPGroup
    from attnserve.distributed.symm_mem_all_reduce import SymmMemAllReduce

    fused = SymmMemAllReduce.create(tp, device)
    separate = SymmMemAllReduce.create(tp, device, fused=False)
    assert fused is not None and separate is not None, "symmetric-memory setup failed (see the warning above)"
    assert fused.fused, "torch lacks one_shot_all_reduce_copy_out: only the unfused path is tested"
    lines, bad = [f"fused: {fused!r}", f"separate: {separate!r}"], []

    def record(case: str, got: torch.Tensor, ref: torch.Tensor) -> None:
        equal = torch.equal(_bits(got), _bits(ref))  # bitwise
        same = _same_on_all_ranks(tp, got)
        diff = (got.float() - ref.float()).abs().max().item()
        lines.append(f"{case:<40} equal_to_nccl={equal} same_on_ranks={same} max_abs_diff={diff:.3g}")
        if not (equal and same):
            bad.append(lines[-1])

    for dtype in DTYPES:
        for rows in ROWS:
            name = f"{str(dtype).removeprefix('torch.')} {rows}x{HIDDEN}"
            x = _inputs(tp.rank, rows, dtype, device, seed=1)
            ref = _nccl(x)
            for comm in (fused, separate):
                got = x.clone()
                assert comm.should_use(got), (name, comm)
                out = comm.all_reduce(got)
                assert out is got  # in place
                record(f"{name} eager {'fused' if comm.fused else 'separate'}", got, ref)
            # a view 4 bytes past a 16-byte boundary: not aligned for the fused kernel, same sum
            base = torch.zeros(rows * HIDDEN + 16 // x.element_size(), dtype=dtype, device=device)
            view = base[4 // x.element_size() :][: rows * HIDDEN].view(rows, HIDDEN)
            view.copy_(x)
            fused.all_reduce(view)
            record(f"{name} eager misaligned view", view, ref)

            # CUDA graph: two all-reduces back to back, replayed twice with new inputs
            a, b = x.clone(), x.clone()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up outside the capture, as the model runner does
                fused.all_reduce(a)
                fused.all_reduce(b)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fused.all_reduce(a)
                fused.all_reduce(b)
            for seed in (2, 3):
                xa, xb = _inputs(tp.rank, rows, dtype, device, seed), _inputs(tp.rank, rows, dtype, device, 10 + seed)
                a.copy_(xa), b.copy_(xb)
                graph.replay()
                record(f"{name} graph replay {seed - 1} (a)", a, _nccl(xa))
                record(f"{name} graph replay {seed - 1} (b)", b, _nccl(xb))
            del graph
            torch.cuda.synchronize()

    # TPGroup: within the limit through symmetric memory, above it through NCCL; both equal NCCL
    group = TPGroup(tp.rank, tp.size, fused)
    for rows in (64, fused.max_bytes // (HIDDEN * 2) + 1):
        x = _inputs(tp.rank, rows, torch.bfloat16, device, seed=4)
        path = "symm-mem" if fused.should_use(x) else "nccl"
        record(f"TPGroup bf16 {rows}x{HIDDEN} ({path})", group.all_reduce(x.clone()), _nccl(x))
    if bad:
        raise AssertionError(f"rank {tp.rank}: {len(bad)} mismatches:\n" + "\n".join(bad))
    return lines


def test_symm_mem_all_reduce_equals_nccl_on_two_gpus():
    from tests.gpu.ranks import run_ranks

    lines = run_ranks(_check_ranks, 2)
    print("\n" + "\n".join(lines))
