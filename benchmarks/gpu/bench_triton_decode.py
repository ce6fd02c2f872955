"""TRITON_ATTN's paged decode (``triton_attention.paged_attention``) with KV tiles of several pages against
the page-at-a-time loop it replaced, in one process: Qwen3 (16 query / 8 KV heads) and Llama-3 8B (32 / 8),
head 128, bfloat16, context 1024, pages of 16 and 64 tokens.

``python -m benchmarks.gpu.bench_triton_decode [--json OUT] [--cases ...] [--max-seq-len N] [--splits N]`` on a
GPU; ``--dry-run`` checks the script on CPU (``TRITON_INTERPRET=1``, batch <= 2 and context 128, wall-clock
times of one call: meaningless as timings).

Each case is one decode step of one layer: ``batch`` requests of ``context`` tokens each (query length 1),
their pages scattered over the cache (a random permutation, as in a busy cache), the block table
``--table-tokens`` wide. The query tiles and the split-KV count come from TRITON_ATTN's own builder
(``TritonAttentionMetadataBuilder.build``) for this GPU's SM count; ``--max-seq-len`` sets the step's
``max_seq_len`` the builder splits by (default the context, as in an eager step; the engine's CUDA graphs
are captured with ``max_model_len``), ``--splits`` forces a split count. Variants, all on the same inputs:

- ``tiled``: the default KV tile (``default_pages_per_tile``: 64 tokens for 16-bit head 128, so 4 pages of
  16, 1 page of 64);
- ``page``: ``pages_per_tile=1``, the first version's loop (one page per iteration); for 64-token pages it
  is the same kernel as ``tiled``, so its ratio shows the noise;
- ``tile128``: tiles of 128 tokens (8 pages of 16, 2 of 64).

Timing: ``gemv.timing.time_per_call_us`` (as ``bench_fa3_decode.py``): one CUDA graph of back-to-back calls
cycling through copies of the KV cache whose total exceeds twice the L2 cache (a decode step reads each
layer's KV from HBM), CUDA events around the replays, microseconds per call. ``TB/s`` is the KV bytes the
call must read (``2 * batch * context * kv_heads * 128 * 2``) over that time; ``x page`` is the ``page``
time over the variant's. Every variant's output is checked against ``reference_paged_attention`` with the
bfloat16 tolerance of ``tests/gpu/cases.py``.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

HEAD = 128
# name -> (batch, q heads, kv heads, context, block size)
CASES = {
    "qwen3_b64": (64, 16, 8, 1024, 16),
    "qwen3_b64_bs64": (64, 16, 8, 1024, 64),
    "llama_b1": (1, 32, 8, 1024, 16),
    "llama_b1_bs64": (1, 32, 8, 1024, 64),
    "llama_b64": (64, 32, 8, 1024, 16),
    "llama_b64_bs64": (64, 32, 8, 1024, 64),
}
VARIANTS = {"tiled": None, "page": 1, "tile128": "128"}  # pages_per_tile (None: default; "128": 128 tokens)


def _wall_us(call, copies, calls=1, replays=1) -> float:  # --dry-run's stand-in for the CUDA-graph timing
    t = time.perf_counter()
    call(copies[0])
    return (time.perf_counter() - t) * 1e6


def decode_call(
    table: torch.Tensor,
    ctx: int | list[int],
    block: int,
    hq: int,
    hkv: int,
    max_seq_len: int,
    num_sms: int | None,
    dev: torch.device,
    kv_cache_dtype: str = "auto",
):
    """TRITON_ATTN's metadata and its one kernel call (``metadata.calls``) for a decode step of ``table``'s
    requests (block table (B, width) int32 on the host), each ``ctx`` tokens long (a list: request i's ``ctx[i]``);
    ``num_sms``: the builder's SM count (None: this GPU's); ``kv_cache_dtype``: the layer's cache dtype (the engine's
    ``--kv-cache-dtype``)."""
    from attnserve.attention.backend import AttentionLayerSpec, CommonAttentionMetadata
    from attnserve.attention.backends.triton_attn import TritonAttentionBackend

    batch = table.shape[0]
    seq_lens = (
        torch.tensor(ctx, dtype=torch.int32) if isinstance(ctx, list) else torch.full((batch,), ctx, dtype=torch.int32)
    )
    qsl = torch.arange(batch + 1, dtype=torch.int32)
    common = CommonAttentionMetadata(
        query_start_loc=qsl.to(dev),
        query_start_loc_cpu=qsl,
        seq_lens=seq_lens.to(dev),
        seq_lens_cpu=seq_lens,
        block_table=table.to(dev),
        slot_mapping=torch.zeros(batch, dtype=torch.int64, device=dev),
        num_reqs=batch,
        num_actual_tokens=batch,
        max_query_len=1,
        max_seq_len=max_seq_len,
        num_decodes=batch,
        num_decode_tokens=batch,
        block_size=block,
        block_table_cpu=table,
    )
    spec = AttentionLayerSpec(
        num_heads=hq, head_size=HEAD, scale=HEAD**-0.5, num_kv_heads=hkv, kv_cache_dtype=kv_cache_dtype
    )
    builder = TritonAttentionBackend.get_builder_cls()(spec, dev, torch.bfloat16)
    if num_sms is not None:
        builder.num_sms = num_sms
    metadata = builder.build(common)
    (call,) = metadata.calls
    return metadata, call


def step_reference(query: torch.Tensor, kv: torch.Tensor, md) -> torch.Tensor:
    """float32 attention of a decode step (``md``: its TRITON_ATTN metadata) over the cache ``kv`` (TRITON_ATTN's
    shape, 16-bit): ``reference_paged_attention``, the check every variant's output meets."""
    from attnserve.kernels.kv_write import kv_views
    from attnserve.kernels.reference import reference_paged_attention

    key_cache, value_cache = kv_views(kv, 1)
    kv32 = torch.stack([key_cache.float(), value_cache.float()])
    return reference_paged_attention(query.float(), kv32, md.query_start_loc, md.seq_lens, md.block_table, HEAD**-0.5)


def make_step(
    batch: int,
    hq: int,
    hkv: int,
    ctx: int,
    block: int,
    table_tokens: int,
    max_seq_len: int,
    num_sms: int,
    dev: torch.device,
    gen: torch.Generator,
) -> dict:
    """One decode step's inputs and TRITON_ATTN's kernel call for it (``metadata.calls``: one call)."""
    from attnserve.attention.backends.triton_attn import TritonAttentionBackend

    per_req = -(-ctx // block)
    width = max(per_req, -(-table_tokens // block))
    num_blocks = batch * per_req + 1
    table = torch.zeros(batch, width, dtype=torch.int32)
    table[:, :per_req] = torch.randperm(batch * per_req, generator=gen).to(torch.int32).view(batch, per_req)
    metadata, call = decode_call(table, ctx, block, hq, hkv, max_seq_len, num_sms, dev)
    cache_shape = TritonAttentionBackend.get_kv_cache_shape(num_blocks, block, hkv, HEAD)
    return dict(
        metadata=metadata,
        call=call,
        cache_shape=cache_shape,
        num_blocks=num_blocks,
        width=width,
        query=torch.randn(batch, hq, HEAD, generator=gen).to(dev, torch.bfloat16),
    )


def bench_case(
    name: str,
    batch: int,
    hq: int,
    hkv: int,
    ctx: int,
    block: int,
    args,
    dev: torch.device,
    num_sms: int,
    l2: int,
    time_us,
) -> dict:
    from attnserve.kernels.kv_write import kv_views
    from attnserve.kernels.triton_attention import default_pages_per_tile, paged_attention
    from tests.gpu.cases import TOLERANCE

    gen = torch.Generator().manual_seed(0)
    step = make_step(batch, hq, hkv, ctx, block, args.table_tokens, args.max_seq_len or ctx, num_sms, dev, gen)
    md, call, query = step["metadata"], step["call"], step["query"]
    splits = args.splits or call.num_splits
    kv_bytes = 2 * batch * ctx * hkv * HEAD * 2
    cache_bytes = 2 * step["num_blocks"] * block * hkv * HEAD * 2
    copies = [
        torch.randn(step["cache_shape"], generator=gen).to(dev, torch.bfloat16)
        for _ in range(max(1, -(-2 * l2 // cache_bytes)))
    ]
    out = torch.empty_like(query)

    def run(
        kv: torch.Tensor, pages_per_tile: int | None, launch: dict | None = None, num_splits: int | None = None
    ) -> torch.Tensor:
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
            num_splits=num_splits or splits,
            split_token_range=call.token_range,
            pages_per_tile=pages_per_tile,
            launch=launch,
        )

    ref = step_reference(query, copies[0], md)
    scale = float(ref.abs().max())
    rows = {}
    for label, ppt in VARIANTS.items():
        if ppt == "128":
            ppt = max(1, 128 // block)
        rel = float((run(copies[0], ppt).float() - ref).abs().max()) / scale
        us = time_us(lambda kv, ppt=ppt: run(kv, ppt), copies, args.calls, args.replays)
        rows[label] = {
            "pages_per_tile": ppt or default_pages_per_tile(block, HEAD, 2),
            "us": round(us, 2),
            "tbps": round(kv_bytes / us / 1e6, 3),
            "rel_err": rel,
            "ok": rel <= TOLERANCE[torch.bfloat16],
        }
    for v in rows.values():
        v["x_page"] = round(rows["page"]["us"] / v["us"], 3)
    sweep = []
    for ppt, split_list, launch in _sweep(args, block, splits):
        for ns in split_list:
            try:
                rel = float((run(copies[0], ppt, launch, ns).float() - ref).abs().max()) / scale
                us = time_us(
                    lambda kv, ppt=ppt, launch=launch, ns=ns: run(kv, ppt, launch, ns), copies, args.calls, args.replays
                )
            except Exception as e:  # noqa: BLE001 - a launch that does not compile (shared memory) is a row
                sweep.append(dict(pages_per_tile=ppt, splits=ns, **launch, error=f"{type(e).__name__}: {e}"[:200]))
                continue
            sweep.append(
                dict(
                    pages_per_tile=ppt,
                    splits=ns,
                    **launch,
                    us=round(us, 2),
                    tbps=round(kv_bytes / us / 1e6, 3),
                    ok=rel <= TOLERANCE[torch.bfloat16],
                )
            )
    return dict(
        case=name,
        batch=batch,
        q_heads=hq,
        kv_heads=hkv,
        context=ctx,
        block_size=block,
        table_width=step["width"],
        num_splits=splits,
        kv_mb=round(kv_bytes / 1e6, 2),
        copies=len(copies),
        variants=rows,
        sweep=sorted(sweep, key=lambda r: r.get("us", 1e9)),
    )


def _sweep(args, block: int, splits: int) -> list[tuple[int, list[int], dict]]:
    """``--sweep``: (pages per tile, split counts, launch options) to time besides the variants."""
    if not args.sweep:
        return []
    split_list = sorted({splits, 2 * splits} if splits == 1 else {splits // 2, splits, 2 * splits, 32} - {0})
    out = []
    for tokens in args.sweep_tokens:
        ppt = max(1, tokens // block)
        for warps in args.sweep_warps:
            for stages in args.sweep_stages:
                for maxnreg in (None, 128) if args.sweep_maxnreg else (None,):
                    launch = dict(num_warps=warps, num_stages=stages)
                    if maxnreg:
                        launch["maxnreg"] = maxnreg
                    out.append((ppt, split_list, launch))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    ap.add_argument(
        "--max-seq-len",
        type=int,
        default=None,
        help="the step's max_seq_len for the builder's split choice (default: the context)",
    )
    ap.add_argument("--splits", type=int, default=None, help="force this split-KV count (default: the builder's)")
    ap.add_argument("--table-tokens", type=int, default=4096, help="block table width in tokens (max_model_len)")
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument(
        "--sweep",
        action="store_true",
        help="also time KV tiles (--sweep-tokens) x warps x stages x maxnreg 128 or not x split counts",
    )
    ap.add_argument("--sweep-tokens", type=int, nargs="+", default=[64, 128], help="--sweep's KV tile sizes (tokens)")
    ap.add_argument("--sweep-warps", type=int, nargs="+", default=[4, 8], help="--sweep's warp counts")
    ap.add_argument("--sweep-stages", type=int, nargs="+", default=[2, 3, 4], help="--sweep's pipeline depths")
    ap.add_argument(
        "--no-sweep-maxnreg",
        dest="sweep_maxnreg",
        action="store_false",
        help="--sweep without the maxnreg=128 variants",
    )
    ap.add_argument("--dry-run", action="store_true", help="check this script on CPU (see the docstring)")
    args = ap.parse_args()
    if not torch.cuda.is_available() and not args.dry_run:
        raise SystemExit("bench_triton_decode needs a CUDA GPU (or --dry-run with TRITON_INTERPRET=1)")

    import triton

    from attnserve.gemv import timing as gemv_timing

    cases = {k: CASES[k] for k in args.cases}
    time_us = gemv_timing.time_per_call_us
    if args.dry_run:
        assert triton.knobs.runtime.interpret, "--dry-run runs the kernels in the interpreter: TRITON_INTERPRET=1"
        from tests.kernels.triton_attention_interpreted import fix_interpreter_bf16_dot

        fix_interpreter_bf16_dot()
        dev, name, num_sms, l2, time_us = torch.device("cpu"), "CPU (dry run)", 132, 1 << 20, _wall_us
        cases = {k: (min(b, 2), hq, hkv, 128, bs) for k, (b, hq, hkv, _, bs) in cases.items()}
    else:
        dev = torch.device("cuda")
        props = torch.cuda.get_device_properties(dev)
        name, num_sms, l2 = props.name, props.multi_processor_count, gemv_timing.l2_bytes(dev)
    print(
        f"{name}: {num_sms} SMs, L2 {l2 >> 20} MiB; torch {torch.__version__}, triton {triton.__version__}; "
        f"bfloat16, head {HEAD}, microseconds per call"
    )
    results, t0 = [], time.perf_counter()
    with torch.no_grad():
        for case, shape in cases.items():
            r = bench_case(case, *shape, args, dev, num_sms, l2, time_us)
            results.append(r)
            print(
                f"== {case}: batch {r['batch']}, {r['q_heads']}/{r['kv_heads']} heads, context {r['context']}, "
                f"block {r['block_size']}, table {r['table_width']} wide, splits {r['num_splits']}, "
                f"KV {r['kv_mb']} MB x {r['copies']} copies"
            )
            for label, v in r["variants"].items():
                print(
                    f"   {label:8s} {v['pages_per_tile']:2d} pages/tile {v['us']:9.2f} us {v['tbps']:7.3f} TB/s "
                    f"x page {v['x_page']:5.2f}  rel err {v['rel_err']:.1e}{'' if v['ok'] else '  WRONG'}",
                    flush=True,
                )
            for row in r["sweep"][:6]:
                print(f"   sweep {row}", flush=True)
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    print(f"{time.perf_counter() - t0:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                dict(
                    device=name,
                    num_sms=num_sms,
                    l2_bytes=l2,
                    torch=torch.__version__,
                    triton=triton.__version__,
                    args=vars(args),
                    results=results,
                ),
                f,
                indent=1,
            )
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
