"""Compile (JIT) the FlashInfer kernels a run will need, ahead of it: ``python -m benchmarks.gpu.flashinfer_warm
HQ:HKV:D[:dtype] ...`` builds the decode (tensor cores when HQ != HKV) and paged-prefill variants of each
head configuration on a tiny batch. FlashInfer caches them in ~/.cache/flashinfer for later processes."""

from __future__ import annotations

import sys
import time

import torch


def warm(hq: int, hkv: int, d: int, dtype: torch.dtype, page: int = 16) -> None:
    import flashinfer

    ws = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    cache = torch.randn(4, 2, page, hkv, d, dtype=dtype, device="cuda")
    indptr = torch.tensor([0, 2], dtype=torch.int32)
    indices = torch.tensor([1, 3], dtype=torch.int32, device="cuda")
    last = torch.tensor([5], dtype=torch.int32)
    dec = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=hq != hkv)
    dec.plan(indptr, indices, last, hq, hkv, d, page, q_data_type=dtype, kv_data_type=dtype)
    dec.run(torch.randn(1, hq, d, dtype=dtype, device="cuda"), cache)
    pre = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
    pre.plan(
        torch.tensor([0, 7], dtype=torch.int32),
        indptr,
        indices,
        last,
        hq,
        hkv,
        d,
        page,
        causal=True,
        q_data_type=dtype,
        kv_data_type=dtype,
        o_data_type=dtype,
    )
    pre.run(torch.randn(7, hq, d, dtype=dtype, device="cuda"), cache)
    torch.cuda.synchronize()


if __name__ == "__main__":
    for spec in sys.argv[1:]:
        parts = spec.split(":")
        dtype = getattr(torch, parts[3]) if len(parts) > 3 else torch.bfloat16
        t = time.perf_counter()
        warm(int(parts[0]), int(parts[1]), int(parts[2]), dtype)
        print(f"flashinfer warm {spec}: {time.perf_counter() - t:.1f} s", flush=True)
