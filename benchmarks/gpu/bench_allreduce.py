"""NCCL vs the symmetric-memory one-shot all-reduce (attnserve/distributed/symm_mem_all_reduce.py) on 2 GPUs, per
call, bfloat16, for decode- and prefill-sized tensors.

``python -m benchmarks.gpu.bench_allreduce [--json OUT] [--sizes-kib 8 64 512 2048 8192]`` from the repository root
on a host with 2 GPUs; about 20 s (mostly process and NCCL start-up).

Per size: one CUDA graph of 64 back-to-back in-place all-reduces of one tensor (a decode step of
Llama-3.1-8B at TP=2 runs 64 of 8 KiB), replayed 20 times between CUDA events on rank 0 after a barrier:
microseconds per all-reduce for NCCL (``dist.all_reduce``), the symmetric-memory path with the copy fused
into its kernel (what the engine runs) and with a separate copy; and the eager time per call of NCCL and
the fused path (64 calls, host launch overhead included: prefill runs eagerly). The symmetric-memory
communicators here take every size listed (``max_bytes`` = the largest), whatever the engine's limit
(``MAX_BYTES``, printed) is: the table shows where the limit should be.
"""

from __future__ import annotations

import argparse
import json

import torch

CALLS = 64
REPLAYS = 20


def _graph_us(fn, x: torch.Tensor) -> float:
    """Microseconds per call of ``fn(x)`` replayed from one CUDA graph of CALLS calls (rank 0's clock)."""
    import torch.distributed as dist

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn(x)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            fn(x)
    graph.replay()
    torch.cuda.synchronize()
    dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(REPLAYS):
        graph.replay()
    end.record()
    end.synchronize()
    del graph
    return start.elapsed_time(end) * 1e3 / (REPLAYS * CALLS)


def _eager_us(fn, x: torch.Tensor) -> float:
    import torch.distributed as dist

    fn(x)
    torch.cuda.synchronize()
    dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(CALLS):
        fn(x)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / CALLS


def _bench_ranks(tp, device, sizes_kib: list[int]) -> dict:
    import torch.distributed as dist

    from attnserve.distributed.symm_mem_all_reduce import MAX_BYTES, SymmMemAllReduce

    largest = max(sizes_kib) * 1024
    fused = SymmMemAllReduce.create(tp, device, max_bytes=largest)
    separate = SymmMemAllReduce.create(tp, device, max_bytes=largest, fused=False)
    if fused is None or separate is None:
        raise RuntimeError("symmetric-memory setup failed (see the warning above)")

    def nccl(x):
        dist.all_reduce(x)

    rows = []
    for kib in sizes_kib:
        x = torch.zeros(kib * 1024 // 2, dtype=torch.bfloat16, device=device)  # zeros: sums stay finite
        rows.append(
            {
                "bytes": kib * 1024,
                "nccl_graph_us": _graph_us(nccl, x),
                "symm_mem_graph_us": _graph_us(fused.all_reduce, x),
                "symm_mem_separate_copy_graph_us": _graph_us(separate.all_reduce, x),
                "nccl_eager_us": _eager_us(nccl, x),
                "symm_mem_eager_us": _eager_us(fused.all_reduce, x),
            }
        )
    return {
        "world_size": tp.size,
        "dtype": "bfloat16",
        "calls_per_graph": CALLS,
        "replays": REPLAYS,
        "engine_max_bytes": MAX_BYTES[tp.size],
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(device),
        "rows": rows,
    }


def _table(result: dict) -> str:
    head = (
        f"{'size':>9} {'NCCL graph':>11} {'symm graph':>11} {'sep. copy':>10} {'speed-up':>9} "
        f"{'NCCL eager':>11} {'symm eager':>11}  (us per all-reduce)"
    )
    lines = [
        f"{result['device']}, torch {result['torch']}, world size {result['world_size']}, bfloat16; "
        f"engine limit {result['engine_max_bytes'] // 1024} KiB",
        head,
        "-" * len(head),
    ]
    for r in result["rows"]:
        size = f"{r['bytes'] // 1024} KiB"
        lines.append(
            f"{size:>9} {r['nccl_graph_us']:>11.2f} {r['symm_mem_graph_us']:>11.2f} "
            f"{r['symm_mem_separate_copy_graph_us']:>10.2f} "
            f"{r['nccl_graph_us'] / r['symm_mem_graph_us']:>8.2f}x "
            f"{r['nccl_eager_us']:>11.2f} {r['symm_mem_eager_us']:>11.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    from tests.gpu.ranks import run_ranks

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="OUT", help="write the results here")
    parser.add_argument("--sizes-kib", type=int, nargs="+", default=[8, 64, 512, 2048, 8192])
    args = parser.parse_args(argv)
    if torch.cuda.device_count() < 2:
        raise SystemExit("needs 2 CUDA GPUs")
    result = run_ranks(_bench_ranks, 2, args.sizes_kib)
    print(_table(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
