"""The Gluon fp8 decode (``kernels/gluon_fp8_decode.py``) against the Triton keys-major one
(``kernels/triton_fp8_decode.py``) and the bf16 decode, in one process.

``python -m benchmarks.gpu.bench_fp8_gluon [--json OUT] [--block-size 16] [--batch 64] [--context 8192]`` on a GPU.
The shape, data, reference and timing are ``bench_fp8_decode``'s (default: batch 64 x 8,192-token contexts, GQA
32/8, head 128, N(0, 2^2) K/V stored as fp8 with scales 10/448 and 12/448, CUDA-graph replays, median). Rows:
``bf16`` is TRITON_ATTN's ``paged_attention`` over a bf16 cache with the builder's plan; ``keys`` the Triton
keys-major fp8 kernel at its defaults; ``gluon`` the Gluon kernel, its defaults first, then ``--configs`` (ring
stages, warps, KV tile, K operand width). Each row's output is checked against the float32 reference over the
same cache (``max_abs``, ``rel`` = max abs / max |ref|; WRONG above ``--tol``); each Gluon config is also checked
on a small ragged step (``ragged``: lengths 1 to a few thousand, not multiples of the tile or page, a shuffled
block table) before it is timed. ``x bf16``: the bf16 row's time over the row's. A config that fails to compile or
launch prints its error and the run goes on.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from benchmarks.gpu.bench_fp8_decode import (
    FP8,
    HEAD,
    K_SCALE,
    V_SCALE,
    build_step,
    fp8_cache,
    graph_median_us,
    measure,
    reference,
    runner,
    show,
    step_args,
)
from benchmarks.gpu.bench_fp8_keys_major import fp8_runner, keys_major_runner, tag

KEYS = ("num_stages", "num_warps", "block_n", "k_width")
# (num_stages, num_warps, block_n, k_width): the kernel's defaults are the first
CONFIGS = [
    (3, 4, 64, 4),
    (2, 4, 64, 4),
    (4, 4, 64, 4),
    (3, 4, 64, 2),
    (3, 8, 64, 4),
    (3, 4, 32, 4),
    (4, 4, 32, 4),
    (4, 2, 32, 4),
    (2, 8, 128, 4),
]
RAGGED = [1, 15, 16, 17, 63, 64, 65, 100, 129, 700, 1000, 2049, 3001, 4095]


def gluon_runner(step: dict):
    """``run(kv, **config)``: one ``gluon_fp8_decode_attention`` call of the step."""
    from attnserve.kernels.gluon_fp8_decode import gluon_fp8_decode_attention

    return fp8_runner(step, gluon_fp8_decode_attention)


def ragged_check(dtype: torch.dtype, block: int, q_heads: int, kv_heads: int, dev, **config) -> float:
    """rel error of one Gluon call over a small ragged decode step (lengths ``RAGGED``, shuffled pages, fp8 cache
    of N(0, 2^2) values, bf16 queries) against the float32 reference."""
    from attnserve.kernels.gluon_fp8_decode import gluon_fp8_decode_attention
    from attnserve.kernels.kv_write import kv_views
    from attnserve.kernels.reference import reference_paged_attention

    gen = torch.Generator(device=dev).manual_seed(1)
    lens = torch.tensor(RAGGED, dtype=torch.int32)
    per_req = -(-int(lens.max()) // block)
    b = len(RAGGED)
    table = torch.randperm(b * per_req, generator=torch.Generator().manual_seed(1)).to(torch.int32).view(b, per_req)
    cache = fp8_cache(torch.randn(b * per_req + 1, 2, block, kv_heads, HEAD, generator=gen, device=dev) * 2, dtype)
    query = torch.randn(b, q_heads, HEAD, generator=gen, device=dev).to(torch.bfloat16)
    table, lens = table.to(dev), lens.to(dev)
    key_cache, value_cache = kv_views(cache, 1)
    out = torch.full_like(query, float("nan"))
    gluon_fp8_decode_attention(
        out, query, key_cache, value_cache, table, lens, HEAD**-0.5, k_scale=K_SCALE, v_scale=V_SCALE, **config
    )
    k = cache[:, 0].float() * K_SCALE
    v = cache[:, 1].float() * V_SCALE
    qsl = torch.arange(b + 1, dtype=torch.int32, device=dev)
    ref = reference_paged_attention(query.float(), torch.stack([k, v]), qsl, lens, table, HEAD**-0.5)
    out = out.float()
    if torch.isnan(out).any():
        return float("nan")
    return float((out - ref).abs().max()) / max(float(ref.abs().max()), 1e-30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json")
    step_args(ap)
    ap.add_argument(
        "--configs",
        nargs="+",
        default=[",".join(map(str, c)) for c in CONFIGS],
        help="Gluon configs num_stages,num_warps,block_n,k_width (the first also runs on e5m2)",
    )
    ap.add_argument("--tol", type=float, default=2e-2, help="rel error above which a row is WRONG")
    ap.add_argument("--no-ragged", dest="ragged", action="store_false", help="skip the ragged-step check")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--replays", type=int, default=10)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_fp8_gluon needs a CUDA GPU")
    import triton

    from attnserve.kernels.gluon_fp8_decode import available

    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    print(
        f"{props.name}: {props.multi_processor_count} SMs; torch {torch.__version__}, triton {triton.__version__}, "
        f"gluon {'yes' if available() else 'NO'}; batch {args.batch} x {args.context}, {args.q_heads}/{args.kv_heads} "
        f"heads, head {HEAD}, block {args.block_size}",
        flush=True,
    )
    configs = [dict(zip(KEYS, map(int, c.split(",")))) for c in args.configs]
    t0 = time.perf_counter()
    with torch.no_grad():
        step = build_step(args, dev, props.multi_processor_count)
        elems = 2 * args.batch * args.context * args.kv_heads * HEAD
        kv16 = step["cache"].to(torch.bfloat16)
        ref = reference(step, kv16)
        bf16 = measure("bf16", runner(step, kv16), kv16, ref, args, graph_median_us, 2 * elems, args.tol)
        rows, bf16_us = [bf16], bf16.get("us")
        print(show(bf16, bf16_us), flush=True)
        del kv16, ref
        for fmt in ("e4m3", "e5m2"):
            kv = fp8_cache(step["cache"], FP8[fmt])
            ref = reference(step, kv)
            rows.append(
                measure(f"{fmt} keys", keys_major_runner(step), kv, ref, args, graph_median_us, elems, args.tol)
            )
            print(show(rows[-1], bf16_us), flush=True)
            for cfg in configs if fmt == "e4m3" else configs[:1]:

                def ragged(cfg=cfg, fmt=fmt):
                    return ragged_check(FP8[fmt], args.block_size, args.q_heads, args.kv_heads, dev, **cfg)

                row = measure(
                    f"{fmt} gluon", gluon_runner(step), kv, ref, args, graph_median_us, elems, args.tol,
                    ragged if args.ragged else None, **cfg,
                )  # fmt: skip
                rows.append(row)
                print(show(row, bf16_us), tag(row, KEYS), flush=True)
            del kv, ref
    ok = sorted([r for r in rows[1:] if "us" in r and r.get("ok")], key=lambda r: r["us"])
    print(f"\n== {time.perf_counter() - t0:.0f} s; table (x bf16: the bf16 row's {bf16_us} us over the row's)")
    for r in rows:
        print(show(r, bf16_us), tag(r, KEYS))
    print("fastest correct fp8 rows:")
    for r in ok[:5]:
        print(show(r, bf16_us), tag(r, KEYS))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                dict(
                    device=props.name,
                    torch=torch.__version__,
                    triton=triton.__version__,
                    args=vars(args),
                    bf16_us=bf16_us,
                    rows=rows,
                ),
                f,
                indent=1,
            )
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
