"""TRITON_ATTN's decode over an fp8 KV cache against its own bf16 run, in one process: each way of feeding the
fp8 tiles to the dots (``triton_attention.FP8_DOT_MODES``), e4m3 and e5m2, then a sweep of tiles and launch
options for the chosen modes, so that one device call picks the best.

``python -m benchmarks.gpu.bench_fp8_decode [--json OUT]`` on a GPU (Llama-3 8B's attention: batch 64 x 8,192-token
contexts, 32 query / 8 KV heads, head 128, block 16, bf16 queries, one decode step of one layer);
``TRITON_INTERPRET=1 ... --tiny`` checks the script on CPU (batch 2, context 100, wall-clock times of one
call: meaningless as timings).

The step's query tiles, split count and launch options come from TRITON_ATTN's builder for this GPU
(``TritonAttentionMetadataBuilder.build``): the ``bf16`` row is what the engine runs for a bf16 cache, the
``default`` fp8 rows what it runs for an fp8 one. Pages are a random permutation of the cache (a busy
cache). Data: N(0, 2^2) K/V (fp8: stored as ``x / scale``, saturated, scales 10/448 and 12/448 so that the
scale folding is exercised), N(0, 1) queries. Each row's output is checked against a float32 reference over
the same cache (fp8: dequantized with the same scales); ``max_abs`` and ``rel`` (max abs / max |ref|) are
printed and a row over ``tests/gpu/cases.py``'s tolerance is marked WRONG. A row that fails to compile or
launch prints its error and the run goes on.

Timing (``graph_median_us``): one CUDA graph of ``--calls`` back-to-back calls, replayed ``--replays`` times
after a warm-up replay, each replay between CUDA events; the median replay, in microseconds per call (the
cache is larger than twice the L2, so every call reads it from HBM). ``TB/s`` is
the KV bytes the call must read over that time; ``x bf16`` the bf16 row's time over the row's. The sweep
stops early (said in the output) when ``--budget`` seconds have passed.
"""

from __future__ import annotations

import argparse
import json
import time
import traceback

import torch

HEAD = 128
K_SCALE, V_SCALE = 10.0 / 448.0, 12.0 / 448.0
FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def _wall_us(call, copies, calls=1, replays=1) -> float:  # --tiny's stand-in for the CUDA-graph timing
    t = time.perf_counter()
    call(copies[0])
    return (time.perf_counter() - t) * 1e6


def graph_median_us(call, copies, calls: int = 20, replays: int = 10) -> float:
    """Median over ``replays`` replays of one CUDA graph of ``calls`` back-to-back ``call(copies[i % n])``, each
    replay between two CUDA events, in microseconds per call; one call and one replay first (compile, warm)."""
    call(copies[0])
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            call(copies[i % len(copies)])
    graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / calls)
    del graph
    return sorted(times)[len(times) // 2]


def step_args(ap: argparse.ArgumentParser) -> None:
    """The step's shape flags that :func:`build_step` reads: batch, context, query and KV heads, block size."""
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--q-heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--block-size", type=int, default=16)


def build_step(args, dev: torch.device, num_sms: int) -> dict:
    """The decode step: block table, TRITON_ATTN's metadata and its kernel call for a bf16 and an fp8 cache
    (``calls[fp8]``), the query, a float32 cache ``(num_blocks, 2, block, Hkv, D)`` of N(0, 2^2) values."""
    from benchmarks.gpu.bench_triton_decode import decode_call

    gen = torch.Generator(device=dev).manual_seed(0)
    b, ctx, bs, hq, hkv = args.batch, args.context, args.block_size, args.q_heads, args.kv_heads
    per_req = -(-ctx // bs)
    num_blocks = b * per_req + 1
    table = torch.randperm(b * per_req, generator=torch.Generator().manual_seed(0)).to(torch.int32)
    table = table.view(b, per_req)
    metadata, call = decode_call(table, ctx, bs, hq, hkv, ctx, num_sms, dev)
    _, call_fp8 = decode_call(table, ctx, bs, hq, hkv, ctx, num_sms, dev, kv_cache_dtype="fp8")
    cache = torch.randn(num_blocks, 2, bs, hkv, HEAD, generator=gen, device=dev) * 2
    query = torch.randn(b, hq, HEAD, generator=gen, device=dev).to(torch.bfloat16)
    return dict(metadata=metadata, calls={False: call, True: call_fp8}, cache=cache, query=query)


def fp8_cache(cache: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``cache`` stored as fp8 ``x / scale`` (K, V scales), saturated as the KV write does."""
    fmax = torch.finfo(dtype).max
    out = torch.empty(cache.shape, dtype=dtype, device=cache.device)
    for i, s in ((0, K_SCALE), (1, V_SCALE)):
        out[:, i] = (cache[:, i] / s).clamp(-fmax, fmax).to(dtype)
    return out


def reference(step: dict, kv: torch.Tensor) -> torch.Tensor:
    """float32 attention over ``kv`` as the kernel reads it (fp8: dequantized with the scales)."""
    from attnserve.kernels.reference import reference_paged_attention

    md = step["metadata"]
    fp8 = kv.dtype in FP8.values()
    k = kv[:, 0].float() * (K_SCALE if fp8 else 1.0)
    v = kv[:, 1].float() * (V_SCALE if fp8 else 1.0)
    ref = reference_paged_attention(
        step["query"].float(), torch.stack([k, v]), md.query_start_loc, md.seq_lens, md.block_table, HEAD**-0.5
    )
    del k, v
    return ref


def runner(step: dict, kv: torch.Tensor):
    """``run(kv, fp8_dot, pages_per_tile, launch, splits)``: one ``paged_attention`` call of the step."""
    from attnserve.kernels.kv_write import kv_views
    from attnserve.kernels.triton_attention import paged_attention

    fp8 = kv.dtype in FP8.values()
    md, call, query = step["metadata"], step["calls"][fp8], step["query"]
    out = torch.empty_like(query)

    def run(kv, fp8_dot=None, pages_per_tile=None, launch=None, splits=None):
        key_cache, value_cache = kv_views(kv, 1)
        return paged_attention(
            out,
            query,
            key_cache,
            value_cache,
            md.block_table,
            md.seq_lens,
            md.query_start_loc,
            call.tile_seq,
            call.tile_start,
            HEAD**-0.5,
            num_splits=splits or call.num_splits,
            k_scale=K_SCALE if fp8 else 1.0,
            v_scale=V_SCALE if fp8 else 1.0,
            split_token_range=call.token_range,
            pages_per_tile=pages_per_tile,
            launch=call.launch if launch is None else launch,
            decode=call.decode,
            fp8_dot=fp8_dot,
        )

    return run


def measure(label: str, run, kv, ref, args, time_us, kv_bytes: int, tol: float, ragged=None, **cfg) -> dict:
    """One row: ``ragged()`` first where given (another step's rel error, ``row["ragged"]``, also within ``tol``),
    then ``run(kv, **cfg)`` checked against ``ref`` and timed; an exception is the row's error."""
    row = dict(label=label, **{k: v for k, v in cfg.items() if v is not None})
    t0 = time.perf_counter()
    try:
        if ragged is not None:
            row["ragged"] = ragged()
        out = run(kv, **cfg).float()
        err = (out - ref).abs()
        row["max_abs"] = float(err.max())
        row["rel"] = row["max_abs"] / max(float(ref.abs().max()), 1e-30)
        row["nan"] = bool(torch.isnan(out).any())
        row["ok"] = row["rel"] <= tol and not row["nan"] and (ragged is None or row["ragged"] <= tol)
        us = time_us(lambda x: run(x, **cfg), [kv], args.calls, args.replays)
        row["us"] = round(us, 2)
        row["tbps"] = round(kv_bytes / us / 1e6, 3)
    except Exception as e:  # noqa: BLE001 - a variant that does not compile or launch is a row with its error
        row["error"] = f"{type(e).__name__}: {e}"[:600]
        print(f"   {label}: ERROR {row['error']}\n{traceback.format_exc()[-1500:]}", flush=True)
    row["s"] = round(time.perf_counter() - t0, 1)
    return row


def show(row: dict, bf16_us: float | None) -> str:
    cfg = " ".join(
        f"{k}={row[k]}" for k in ("fp8_dot", "pages_per_tile", "launch", "splits") if row.get(k) not in (None, {})
    )
    if "error" in row:
        return f"{row['label']:<14} {cfg}  ERROR {row['error'][:160]}"
    ratio = f"{bf16_us / row['us']:5.2f}x" if bf16_us else "   - "
    mark = "" if row["ok"] else "  WRONG"
    ragged = f" ragged {row['ragged']:.2e}" if "ragged" in row else ""
    return (
        f"{row['label']:<14} {row['us']:9.2f} us {row['tbps']:6.3f} TB/s {ratio} bf16  max_abs {row['max_abs']:.2e} "
        f"rel {row['rel']:.2e}{ragged}{mark}  {cfg}"
    )


def sweep_configs(args, block: int) -> list[dict]:
    """``--sweep``'s configs (fp8_dot, pages per tile, launch, splits), in order: the first swept mode's grid
    (tiles x warps x stages x maxnreg x splits), a few configs off the grid for the first two modes (register
    cap for 3 programs an SM, a deeper pipeline, 256-token tiles, two splits), then the other modes' grids."""

    def cfg(mode, tokens, warps, stages, maxnreg=0, splits=1):
        launch = dict(num_warps=warps, num_stages=stages)
        if maxnreg:
            launch["maxnreg"] = maxnreg
        return dict(fp8_dot=mode, pages_per_tile=max(1, tokens // block), launch=launch, splits=splits)

    def grid(mode):
        return [
            cfg(mode, tokens, warps, stages, maxnreg, splits)
            for tokens in args.sweep_tokens
            for warps in args.sweep_warps
            for stages in args.sweep_stages
            for maxnreg in args.sweep_maxnreg
            for splits in args.sweep_splits
        ]

    extra = [
        c
        for mode in args.sweep_modes[:2]
        for c in (
            cfg(mode, 128, 4, 2, maxnreg=168),
            cfg(mode, 64, 4, 4),
            cfg(mode, 256, 8, 2),
            cfg(mode, 128, 4, 2, splits=2),
        )
    ]
    out = grid(args.sweep_modes[0]) + (extra if args.sweep_extra else [])
    for mode in args.sweep_modes[1:]:
        out += grid(mode)
    return out


def main() -> None:
    from attnserve.kernels.attention_tiles import FP8_DOT_MODES, default_fp8_dot

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the results here")
    step_args(ap)
    ap.add_argument("--modes", nargs="+", choices=FP8_DOT_MODES, default=list(FP8_DOT_MODES), help="fp8 paths")
    ap.add_argument("--kv", nargs="+", choices=list(FP8), default=list(FP8), help="fp8 formats")
    ap.add_argument("--no-sweep", dest="sweep", action="store_false", help="only the modes at their defaults")
    ap.add_argument("--sweep-modes", nargs="+", choices=FP8_DOT_MODES, default=["f16v", "f16kv", "f16asmv"])
    ap.add_argument("--no-sweep-extra", dest="sweep_extra", action="store_false", help="only the grids")
    ap.add_argument("--sweep-kv", choices=list(FP8), default="e4m3", help="the format the sweep runs on")
    ap.add_argument("--sweep-tokens", type=int, nargs="+", default=[64, 128], help="KV tile sizes (tokens)")
    ap.add_argument("--sweep-warps", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--sweep-stages", type=int, nargs="+", default=[2, 3])
    ap.add_argument("--sweep-maxnreg", type=int, nargs="+", default=[0], help="0: none")
    ap.add_argument("--sweep-splits", type=int, nargs="+", default=[1], help="split-KV counts (1: none)")
    ap.add_argument("--budget", type=float, default=200.0, help="stop the sweep after this many seconds")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--tiny", action="store_true", help="check this script on CPU (TRITON_INTERPRET=1)")
    args = ap.parse_args()

    import triton

    from tests.gpu.cases import TOLERANCE

    time_us = graph_median_us
    if args.tiny:
        assert triton.knobs.runtime.interpret, "--tiny runs the kernels in the interpreter: TRITON_INTERPRET=1"
        from tests.kernels.triton_attention_interpreted import fix_interpreter_bf16_dot

        fix_interpreter_bf16_dot()
        dev, name, num_sms, time_us = torch.device("cpu"), "CPU (tiny, interpreter)", 132, _wall_us
        args.batch, args.context = min(args.batch, 2), min(args.context, 100)
    elif not torch.cuda.is_available():
        raise SystemExit("bench_fp8_decode needs a CUDA GPU (or --tiny with TRITON_INTERPRET=1)")
    else:
        dev = torch.device("cuda")
        props = torch.cuda.get_device_properties(dev)
        name, num_sms = props.name, props.multi_processor_count
    t_start = time.perf_counter()
    print(
        f"{name}: {num_sms} SMs; torch {torch.__version__}, triton {triton.__version__}; batch {args.batch} x "
        f"{args.context} tokens, {args.q_heads}/{args.kv_heads} heads, head {HEAD}, block {args.block_size}",
        flush=True,
    )
    with torch.no_grad():
        step = build_step(args, dev, num_sms)
        builder = {
            kind: dict(splits=c.num_splits, launch=c.launch, decode=c.decode)
            for kind, c in (("bf16", step["calls"][False]), ("fp8", step["calls"][True]))
        }
        print(f"builder: {builder}", flush=True)
        elems = 2 * args.batch * args.context * args.kv_heads * HEAD  # K and V elements the step reads
        rows: list[dict] = []

        kv16 = step["cache"].to(torch.bfloat16)
        ref = reference(step, kv16)
        row = measure("bf16", runner(step, kv16), kv16, ref, args, time_us, 2 * elems, TOLERANCE[torch.bfloat16])
        rows.append(row)
        bf16_us = row.get("us")
        print(show(row, bf16_us), flush=True)
        del kv16, ref

        caches = {}
        for fmt in args.kv:
            kv = fp8_cache(step["cache"], FP8[fmt])
            ref = reference(step, kv)
            caches[fmt] = (kv, ref)
            for mode in args.modes:
                label = f"{fmt} default" if mode == default_fp8_dot(torch.bfloat16) else fmt
                row = measure(label, runner(step, kv), kv, ref, args, time_us, elems, TOLERANCE["fp8"], fp8_dot=mode)
                rows.append(row)
                print(show(row, bf16_us), flush=True)
            if fmt != args.sweep_kv and dev.type == "cuda":
                del caches[fmt], kv, ref
                torch.cuda.empty_cache()
        del step["cache"]

        swept, stopped = [], None
        if args.sweep and args.sweep_kv in caches:
            kv, ref = caches[args.sweep_kv]
            configs = sweep_configs(args, args.block_size)
            print(f"== sweep: {len(configs)} configs on {args.sweep_kv}", flush=True)
            for i, cfg in enumerate(configs):
                if time.perf_counter() - t_start > args.budget:
                    stopped = f"budget of {args.budget:.0f} s spent after {i} of {len(configs)} configs"
                    print(f"== sweep stopped: {stopped}", flush=True)
                    break
                row = measure(
                    f"sweep {args.sweep_kv}", runner(step, kv), kv, ref, args, time_us, elems, TOLERANCE["fp8"], **cfg
                )
                swept.append(row)
                print(show(row, bf16_us), flush=True)

    timed = [r for r in rows[1:] + swept if "us" in r and r["ok"]]
    best = {}
    for fmt in args.kv:
        mine = [r for r in timed if fmt in r["label"]]
        if mine:
            best[fmt] = min(mine, key=lambda r: r["us"])
    print(f"\n== {time.perf_counter() - t_start:.0f} s; table (x bf16: the bf16 row's {bf16_us} us over the row's)")
    print(show(rows[0], bf16_us))
    for r in rows[1:]:
        print(show(r, bf16_us))
    for r in sorted([r for r in swept if "us" in r], key=lambda r: r["us"])[:8]:
        print(show(r, bf16_us))
    for fmt, r in best.items():
        print(f"best {fmt}: {show(r, bf16_us)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                dict(
                    device=name,
                    num_sms=num_sms,
                    torch=torch.__version__,
                    triton=triton.__version__,
                    args=vars(args),
                    builder=builder,
                    bf16_us=bf16_us,
                    rows=rows,
                    sweep=swept,
                    sweep_stopped=stopped,
                    best=best,
                ),
                f,
                indent=1,
            )
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
