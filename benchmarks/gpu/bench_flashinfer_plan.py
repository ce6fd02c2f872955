"""FLASHINFER's CUDA-graph decode replays: host work per replay, device synchronisation, step time, before
and after the fi-graph change, on a Qwen3-0.6B attention shape (16 query heads, 8 KV heads, head 128,
bf16, block 16) with ``--layers`` attention layers per graph.

``python -m benchmarks.gpu.bench_flashinfer_plan [--json OUT] [--context 1024] [--batch-sizes 1 64] [--layers 28]``
on a GPU. "before" is the builder's CUDA-graph path as it was (kept below as ``LegacyBuilder``: page arrays
built on the host, FlashInfer's ``plan()`` on every replay with a host page-id tensor), "after" the current
``FlashInferMetadataBuilder``. For each batch size, both:

* ``prepare_us``: host time of ``prepare_cudagraph_replay`` (median of ``--iters`` calls, idle GPU);
* ``sync_debug_raises``: whether it raises under ``torch.cuda.set_sync_debug_mode("error")`` (a blocking
  copy, ``.item()`` of a device tensor, a stream/device synchronisation);
* ``prepare_behind_gpu_ms``: its host time while the GPU is still busy with a 50 ms kernel: ~0 when it never
  waits for the device, ~50 when it synchronises (what async scheduling would pay every step);
* ``step_ms``: one decode step through ``CudaGraphRunner.run`` (staging copies, prepare, replay), back to back;
  ``replay_gpu_ms``: GPU time of one graph replay (CUDA events);
* ``max_abs_diff_vs_eager``: the replayed attention output against an eager ``build()`` of the same step;
* ``replay_kernels``/``replay_kernel_ms``/``top_kernels``: the kernels of one replay (torch profiler).

``eager_forward_ms``: the same ``--layers`` layers run eagerly on one eager plan (GPU time, launches included).

Then ``replan`` (after only): what a replay of that batch size re-plans (``none``/``fast``/``plan``), and
``legacy_paged_us`` (before only): the old host page-array code alone (torch CPU ops with a boolean-mask
gather, whose OpenMP threads dominate its time on a busy host: 2.8 ms at batch 64 on a loaded 2-core machine,
0.05 ms with one thread).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

from attnserve.attention.backend import AttentionLayerSpec, CommonAttentionMetadata
from attnserve.attention.backends.flashinfer import (
    FlashInferBackend,
    FlashInferCall,
    FlashInferMetadata,
    FlashInferMetadataBuilder,
    _workspace,
)
from attnserve.attention.backends.flashinfer_impl import FlashInferImpl
from attnserve.model_executor.cuda_graph import CudaGraphRunner
from attnserve.attention.forward_batch import ForwardBatch
from attnserve.model_executor.forward_batch import HostBatch, PinnedStaging
from benchmarks.gpu.bench_decode_graph import profile_kernels

HQ, HKV, D, PAGE = 16, 8, 128, 16


class LegacyBuilder(FlashInferMetadataBuilder):
    """The CUDA-graph path before fi-graph, verbatim: ``_paged`` builds indptr/last_page_len with torch CPU
    ops and the page ids from the host block table (a pageable host tensor); every replay calls the
    wrapper's ``plan()``, which copies that host tensor into the graph's buffer with a blocking copy."""

    def _paged(self, common, first, last):
        bs = common.block_size
        seq_lens = common.seq_lens_cpu[first:last]
        nblocks = (seq_lens + bs - 1) // bs
        indptr = torch.zeros(last - first + 1, dtype=torch.int32)
        indptr[1:] = torch.cumsum(nblocks, 0)
        last_len = (seq_lens - (nblocks - 1) * bs).to(torch.int32)
        table = common.block_table_cpu if common.block_table_cpu is not None else common.block_table
        table = table[first:last]
        owned = torch.arange(table.shape[1], device=table.device)[None, :] < nblocks.to(table.device)[:, None]
        return indptr, table[owned].to(torch.int32), last_len

    def _legacy_plan_decode(self, wrapper, common, first, last):
        spec = self.layer_spec
        indptr, indices, last_len = self._paged(common, first, last)
        window = spec.sliding_window - 1 if spec.sliding_window else -1
        wrapper.plan(
            indptr,
            indices,
            last_len,
            spec.num_heads,
            spec.num_kv_heads,
            spec.head_size,
            common.block_size,
            window_left=window,
            logits_soft_cap=spec.logits_soft_cap,
            q_data_type=self.dtype,
            kv_data_type=self.kv_dtype,
            sm_scale=spec.scale,
        )

    def build_for_cudagraph_capture(self, common):
        import flashinfer

        bs, spec = common.num_reqs, self.layer_spec
        need = bs * common.block_table.shape[1]
        if getattr(self, "_graph_indices", None) is None or self._graph_indices.numel() < need:
            self._graph_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=self.device)
            self._graph_last_len = torch.zeros(bs, dtype=torch.int32, device=self.device)
            self._graph_indices = torch.zeros(need, dtype=torch.int32, device=self.device)
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            _workspace(self.device),
            self.kv_cache_layout.value,
            use_cuda_graph=True,
            use_tensor_cores=spec.num_heads != spec.num_kv_heads,
            paged_kv_indptr_buffer=self._graph_indptr[: bs + 1],
            paged_kv_indices_buffer=self._graph_indices[:need],
            paged_kv_last_page_len_buffer=self._graph_last_len[:bs],
        )
        self._legacy_plan_decode(wrapper, common, 0, bs)
        return FlashInferMetadata(
            common.slot_mapping,
            [FlashInferCall("decode", 0, bs, wrapper)],
            common.query_start_loc,
            common.seq_lens,
            common.block_table,
        )

    def cudagraph_prologue(self, metadata):
        pass

    def prepare_cudagraph_replay(self, metadata, common):
        self._legacy_plan_decode(metadata.calls[0].wrapper, common, 0, common.num_reqs)


def host_batch(n: int, context: int, max_blocks: int, perm: np.ndarray) -> HostBatch:
    """``n`` decodes at position ``context`` (seq_len context + 1), each with its own blocks."""
    blocks = -(-(context + 1) // PAGE)
    table = perm[: n * blocks].reshape(n, blocks).astype(np.int32)
    pos = np.full(n, context, np.int64)
    slots = table[:, context // PAGE].astype(np.int64) * PAGE + context % PAGE
    assert blocks <= max_blocks
    return HostBatch(
        input_ids=np.zeros(n, np.int64),
        positions=pos,
        slot_mapping=slots,
        query_start_loc=np.arange(n + 1, dtype=np.int32),
        seq_lens=np.full(n, context + 1, np.int32),
        block_table=table,
        num_decodes=n,
        max_query_len=1,
        max_seq_len=context + 1,
    )


def eager_common(host: HostBatch, device) -> CommonAttentionMetadata:
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
    return CommonAttentionMetadata(
        query_start_loc=t(host.query_start_loc).to(device),
        query_start_loc_cpu=t(host.query_start_loc),
        seq_lens=t(host.seq_lens).to(device),
        seq_lens_cpu=t(host.seq_lens),
        block_table=t(host.block_table).to(device),
        slot_mapping=t(host.slot_mapping).to(device),
        num_reqs=host.num_reqs,
        num_actual_tokens=host.num_tokens,
        max_query_len=1,
        max_seq_len=host.max_seq_len,
        num_decodes=host.num_reqs,
        num_decode_tokens=host.num_reqs,
        block_size=PAGE,
        block_table_cpu=t(host.block_table),
    )


@torch.inference_mode()  # as the model runner runs
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--iters", type=int, default=200)
    args = ap.parse_args()
    t_start = time.perf_counter()
    dev = torch.device("cuda")
    dtype = torch.bfloat16
    torch.manual_seed(0)
    max_model_len = 4096
    max_blocks = max_model_len // PAGE
    top = max(args.batch_sizes)
    sizes = sorted(set(args.batch_sizes))
    num_blocks = top * -(-(args.context + 1) // PAGE) + 64
    null = num_blocks  # the runner's spare block
    cache = torch.randn(FlashInferBackend.get_kv_cache_shape(num_blocks + 1, PAGE, HKV, D), dtype=dtype, device=dev)
    spec = AttentionLayerSpec(num_heads=HQ, head_size=D, scale=D**-0.5, num_kv_heads=HKV)
    impl = FlashInferImpl(spec)
    q = torch.randn(sizes[-1], HQ, D, dtype=dtype, device=dev)
    k = torch.randn(sizes[-1], HKV, D, dtype=dtype, device=dev)
    v = torch.randn(sizes[-1], HKV, D, dtype=dtype, device=dev)

    def forward(input_ids, positions, batch: ForwardBatch) -> torch.Tensor:
        n = input_ids.shape[0]
        for _ in range(args.layers):
            out = impl.forward(q[:n], k[:n], v[:n], cache, batch.attn_metadata)
        return out.view(n, HQ * D)

    perm = np.random.default_rng(0).permutation(num_blocks).astype(np.int32)
    builders = {"before": LegacyBuilder(spec, dev, dtype), "after": FlashInferMetadataBuilder(spec, dev, dtype)}
    runners = {}
    for name, b in builders.items():
        r = CudaGraphRunner(
            forward,
            b,
            [cache],
            sizes=sizes,
            device=dev,
            block_size=PAGE,
            max_blocks=max_blocks,
            null_block=null,
            max_model_len=max_model_len,
        )
        r.capture()
        runners[name] = r
        print(f"{name}: captured {sizes} in {r.capture_seconds:.1f} s", flush=True)
    staging = PinnedStaging(dev)
    results = {
        "context": args.context,
        "layers": args.layers,
        "iters": args.iters,
        "device": torch.cuda.get_device_name(dev),
        "split_limit": builders["after"].split_limit,
        "torch_threads": torch.get_num_threads(),
        "rows": [],
    }
    for n in args.batch_sizes:
        host = host_batch(n, args.context, max_blocks, perm)
        # eager reference of the same step (the new builder's build(), FlashInfer's non-graph wrappers)
        batch = ForwardBatch(
            torch.zeros(n, dtype=torch.int64, device=dev),
            None,
            None,
            builders["after"].build(eager_common(host, dev)),
            [cache],
        )
        eager = forward(batch.input_ids, None, batch).float()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            forward(batch.input_ids, None, batch)
        end.record()
        torch.cuda.synchronize()
        results.setdefault("eager_forward_ms", {})[n] = start.elapsed_time(end) / 20  # planned once, launches only
        for name, r in runners.items():
            b = builders[name]
            bs = r.bucket(n)
            g = r.graphs[bs]
            out = r.run(host, staging).float()
            torch.cuda.synchronize()
            diff = (out - eager).abs().max().item()
            # the common metadata a replay of this step hands to the builder (as CudaGraphRunner.run builds it)
            lens = np.concatenate([host.seq_lens, np.ones(bs - n, np.int32)])
            table = np.concatenate([host.block_table, np.full((bs - n, host.block_table.shape[1]), null, np.int32)])
            staging.begin()
            common = r._common(bs, staging.pinned("b_lens", lens), staging.pinned("b_table", table), host.max_seq_len)
            staging.end()
            for _ in range(10):
                b.prepare_cudagraph_replay(g.metadata, common)
            torch.cuda.synchronize()
            times = []
            for _ in range(args.iters):
                t0 = time.perf_counter()
                b.prepare_cudagraph_replay(g.metadata, common)
                times.append(time.perf_counter() - t0)
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                b.prepare_cudagraph_replay(g.metadata, common)
                raises = None
            except RuntimeError as e:
                raises = str(e).split("\n")[0][:160]
            finally:
                torch.cuda.set_sync_debug_mode("default")
            torch.cuda.synchronize()
            torch.cuda._sleep(100_000_000)  # ~50 ms at the H200's ~2 GHz
            t0 = time.perf_counter()
            b.prepare_cudagraph_replay(g.metadata, common)
            behind = (time.perf_counter() - t0) * 1e3
            torch.cuda.synchronize()
            # whole steps, back to back (host staging, prepare, replay); then replays alone on the GPU
            for _ in range(5):
                r.run(host, staging)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(args.iters):
                r.run(host, staging)
            torch.cuda.synchronize()
            step_ms = (time.perf_counter() - t0) * 1e3 / args.iters
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(args.iters):
                g.graph.replay()
            end.record()
            torch.cuda.synchronize()
            n_kernels, kernel_ms, top = profile_kernels(g.graph.replay)
            row = {
                "version": name,
                "batch": n,
                "bucket": bs,
                "prepare_us": statistics.median(times) * 1e6,
                "prepare_us_mean": statistics.fmean(times) * 1e6,
                "sync_debug_raises": raises,
                "prepare_behind_gpu_ms": behind,
                "step_ms": step_ms,
                "replay_gpu_ms": start.elapsed_time(end) / args.iters,
                "max_abs_diff_vs_eager": diff,
                "replay_kernels": n_kernels,
                "replay_kernel_ms": kernel_ms,
                "top_kernels": {k: [c, round(us, 1)] for k, (c, us) in list(top.items())[:5]},
            }
            if name == "after":
                row["replan"] = g.metadata.graph.replan
            else:  # the legacy host page arrays alone (torch CPU ops, a boolean-mask gather among them)
                paged = []
                for _ in range(args.iters):
                    t0 = time.perf_counter()
                    b._paged(common, 0, bs)
                    paged.append(time.perf_counter() - t0)
                row["legacy_paged_us"] = statistics.median(paged) * 1e6
            results["rows"].append(row)
            print(json.dumps(row), flush=True)
    results["seconds"] = time.perf_counter() - t_start
    print(
        f"{'version':<7} {'batch':>5} {'prepare_us':>10} {'sync':>5} {'behind_ms':>9} {'step_ms':>8} "
        f"{'gpu_ms':>7} {'diff':>8} replan"
    )
    for row in results["rows"]:
        print(
            f"{row['version']:<7} {row['batch']:>5} {row['prepare_us']:>10.1f} "
            f"{'yes' if row['sync_debug_raises'] else 'no':>5} {row['prepare_behind_gpu_ms']:>9.2f} "
            f"{row['step_ms']:>8.3f} {row['replay_gpu_ms']:>7.3f} {row['max_abs_diff_vs_eager']:>8.2e} "
            f"{row.get('replan', '')}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
