"""Paged decode attention through each backend's ``Impl.forward``, by KV-cache layout (NHD / HND) and block
size, in one process: how close each gets to the copy bandwidth measured in the same run.

``python -m benchmarks.gpu.bench_decode_layout [--json OUT] [--backends ...] [--cases ...] [--block-sizes 16 64]``
on a GPU.

Cases (bfloat16, head 128, every request ``context`` tokens, query length 1): ``qwen3_b64`` (64 requests,
16 query / 8 KV heads: issue 8's Qwen3-0.6B batch-64 step), ``llama_b64`` (64, 32 / 8) and ``llama_b1``
(1, 32 / 8). The block tables are in random order (``attnserve.benchmarks.attention.make_step``). One call is the
backend's ``Impl.forward`` (the K/V write of the step's new tokens included), its metadata built once by
the backend's own builder, as in ``attnserve bench attention``.

Timing: ``gemv.timing.time_per_call_us``: one CUDA graph of back-to-back calls cycling through copies of
the KV cache whose total exceeds twice the L2 cache (a decode step reads each layer's KV from HBM), CUDA
events around the replays. ``TB/s`` = K and V bytes the step must read / time; ``% copy`` against
``roofline.measure_copy_bandwidth`` (the fastest of 20 device-to-device copies) measured first. Each
variant's output is checked against the NHD layout of the same backend and block size (same inputs).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

HEAD = 128
CASES = {"qwen3_b64": (64, 16, 8, 1024), "llama_b64": (64, 32, 8, 1024), "llama_b1": (1, 32, 8, 1024)}
LAYOUTS = {"FLASHINFER": ("NHD", "HND"), "TRITON_ATTN": ("NHD", "HND"), "FLASH_ATTN": ("NHD",)}


def bench(
    backend: str, layout_name: str, case: tuple[int, int, int, int], block: int, dev: torch.device, l2: int, args
) -> dict:
    from attnserve.attention.backend import KVCacheLayout
    from attnserve.attention.registry import lookup_backend
    from attnserve.benchmarks.attention import AttentionBenchShape, make_step
    from attnserve.gemv import timing as gemv_timing
    from attnserve.model_executor.kv_cache import allocate_kv_caches

    batch, hq, hkv, ctx = case
    layout = KVCacheLayout(layout_name)
    cls = lookup_backend(backend).get_class()
    shape = AttentionBenchShape(hq, hkv, HEAD, block, torch.bfloat16)
    gen = torch.Generator().manual_seed(0)
    common, num_blocks = make_step([1] * batch, [ctx] * batch, block, gen, dev)
    spec = shape.spec()
    builder = cls.get_builder_cls()(spec, dev, torch.bfloat16, kv_cache_layout=layout)
    impl = cls.get_impl_cls()(spec)
    cache_bytes = 2 * num_blocks * block * hkv * HEAD * 2
    copies = []
    for i in range(max(1, -(-2 * l2 // cache_bytes))):
        (kv,) = allocate_kv_caches(cls, layout, 1, num_blocks, block, hkv, HEAD, torch.bfloat16, dev)
        # the same logical values in every layout (normal_ on the tensor itself would follow memory order)
        kv.copy_(
            torch.randn(
                kv.shape, generator=torch.Generator(device=dev).manual_seed(i), device=dev, dtype=torch.bfloat16
            )
        )
        copies.append(kv)
    dgen = torch.Generator(device=dev).manual_seed(1)
    q, k, v = (torch.randn(batch, h, HEAD, generator=dgen, device=dev, dtype=torch.bfloat16) for h in (hq, hkv, hkv))
    metadata = builder.build(common)
    with torch.inference_mode():
        out = impl.forward(q, k, v, copies[0], metadata).clone()
        us = gemv_timing.time_per_call_us(
            lambda kv: impl.forward(q, k, v, kv, metadata), copies, args.calls, args.replays
        )
    kv_bytes = 2 * batch * ctx * hkv * HEAD * 2
    return dict(
        backend=backend,
        layout=layout_name,
        block_size=block,
        us=round(us, 2),
        tbps=round(kv_bytes / us / 1e6, 3),
        copies=len(copies),
        out=out,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json")
    ap.add_argument("--backends", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--block-sizes", nargs="+", type=int, default=[16, 64])
    ap.add_argument("--layouts", nargs="+", default=["NHD", "HND"], choices=["NHD", "HND"])
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--replays", type=int, default=10)
    args = ap.parse_args()
    from attnserve.benchmarks.roofline import measure_copy_bandwidth
    from attnserve.gemv import timing as gemv_timing

    dev = torch.device("cuda")
    l2 = gemv_timing.l2_bytes(dev)
    copy_tbps = measure_copy_bandwidth(dev) / 1e12
    print(f"{torch.cuda.get_device_name(dev)}: copy {copy_tbps:.3f} TB/s, L2 {l2 >> 20} MiB", flush=True)
    rows, t0 = [], time.perf_counter()
    for case_name in args.cases:
        for block in args.block_sizes:
            for backend in args.backends:
                ref = None
                for layout in [x for x in LAYOUTS[backend] if x in args.layouts]:
                    try:
                        r = bench(backend, layout, CASES[case_name], block, dev, l2, args)
                    except Exception as e:  # noqa: BLE001 - one variant's failure is a row
                        rows.append(
                            dict(
                                case=case_name,
                                backend=backend,
                                layout=layout,
                                block_size=block,
                                error=f"{type(e).__name__}: {' '.join(str(e).split())[:300]}",
                            )
                        )
                        print(
                            f"{case_name:10s} {backend:12s} {layout} bs{block:<4d} ERROR {rows[-1]['error']}",
                            flush=True,
                        )
                        continue
                    out = r.pop("out")
                    ref = out if ref is None else ref
                    r.update(
                        case=case_name,
                        pct_copy=round(100 * r["tbps"] / copy_tbps, 1),
                        max_diff_vs_nhd=float((out.float() - ref.float()).abs().max()),
                    )
                    rows.append(r)
                    print(
                        f"{case_name:10s} {backend:12s} {layout} bs{block:<4d} {r['us']:8.2f} us "
                        f"{r['tbps']:6.3f} TB/s {r['pct_copy']:5.1f}% diff {r['max_diff_vs_nhd']:.1e}",
                        flush=True,
                    )
                torch.cuda.empty_cache()
    print(f"{time.perf_counter() - t0:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                dict(device=torch.cuda.get_device_name(dev), copy_tbps=copy_tbps, args=vars(args), rows=rows),
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
