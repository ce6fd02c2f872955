"""CUDA graphs on the GPU: decode steps replay captured graphs and compute what eager steps compute.

For each installed backend that declares CUDA-graph support, on the default model (real weights):
* a decode step of 3 requests (padded to the 4-request bucket) gives the same logits replayed as eagerly:
  identical in float32 for TRITON_ATTN, within 16-bit rounding for the others (padding changes the matmul
  shapes cuBLAS picks kernels for, so 16-bit sums may round differently);
* ``generate`` replays graphs for its decode steps and, in float32, gives the eager engine's tokens;
* FLASHINFER at the backend level: replays at batch sizes 1..64 (both sides of FlashInfer's split limit) and
  contexts 1..4k match the reference and the eager build, and their host work never synchronises.
"""

from __future__ import annotations

import gc

import pytest
import torch

from attnserve import LLM, SamplingParams
from attnserve.engine.scheduler import ScheduledRequest, SchedulerOutput
from tests.gpu.backends import _has

pytestmark = pytest.mark.gpu

GREEDY = SamplingParams(temperature=0.0, max_tokens=1)
PROMPTS = ["The capital of France is", "def fibonacci(n):", "1, 2, 3, 4,"]

CASES = [  # (label, backend, attention_config, dtype, relative tolerance of the decode logits)
    ("TRITON_ATTN fp32", "TRITON_ATTN", {}, "float32", 1e-5),
    ("TRITON_ATTN bf16", "TRITON_ATTN", {}, "bfloat16", 2e-2),
    ("FLASH_ATTN/3 bf16", "FLASH_ATTN", {"flash_attn_version": 3}, "bfloat16", 2e-2),
    ("FLASH_ATTN/4 bf16", "FLASH_ATTN", {"flash_attn_version": 4}, "bfloat16", 2e-2),
    ("FLASHINFER bf16", "FLASHINFER", {}, "bfloat16", 2e-2),
]


def _installed(backend: str, cfg: dict) -> bool:
    """The package the backend (or FlashAttention version) declares is importable here."""
    if backend == "FLASH_ATTN":
        from attnserve.attention.backends.flash_attn_versions import FLASH_ATTN_VERSIONS

        return _has(FLASH_ATTN_VERSIONS[cfg["flash_attn_version"]].package)
    from attnserve.attention.registry import get_backend_class, lookup_backend

    return _has(get_backend_class(lookup_backend(backend)).required_package)


def prefill_then_decode_step(llm: LLM) -> SchedulerOutput:
    """Prefill each of PROMPTS in its own eager step (4 blocks each, no scheduler), then return one decode
    step of all three (token 42 + i), to be run as a graph replay or eagerly."""
    runner = llm.engine.runner
    prompts = [llm.tokenizer.encode(p) for p in PROMPTS]
    tables = [[10 * i + j for j in range(4)] for i in range(len(prompts))]
    for i, p in enumerate(prompts):
        runner.compute_logits(SchedulerOutput([ScheduledRequest(f"r{i}", p, 0, tables[i], GREEDY, True)]))
    return SchedulerOutput(
        [ScheduledRequest(f"r{i}", [42 + i], len(p), tables[i], GREEDY, True) for i, p in enumerate(prompts)]
    )


@pytest.fixture(scope="module")
def default_gguf():
    from attnserve.model_executor.loader import resolve_model_source

    return resolve_model_source(None).path


@pytest.mark.parametrize("label,backend,cfg,dtype,tol", CASES, ids=[c[0] for c in CASES])
def test_decode_graph_matches_eager(label, backend, cfg, dtype, tol, default_gguf):
    if not _installed(backend, cfg):
        pytest.skip(f"{label}: not installed")
    llm = LLM(
        default_gguf,
        dtype=dtype,
        device="cuda",
        attention_backend=backend,
        attention_config=cfg,
        kv_cache_memory=1 << 30,
        max_num_seqs=64,
        use_skinny_gemm=False,  # cuBLAS, as the eager engine below (tests/gpu/test_skinny_gemm.py: with the plan)
    )
    runner = llm.engine.runner
    assert runner.cuda_graphs is not None, f"{label}: no CUDA graphs captured"
    assert runner.cuda_graphs.sizes == [1, 2, 4, 8, 16, 32, 48, 64]
    # prefill each prompt (eager), then one decode step of all three: graph replay vs eager
    step = prefill_then_decode_step(llm)
    before = runner.cuda_graphs.replays
    graph_logits = runner.compute_logits(step).float().cpu()
    assert runner.cuda_graphs.replays == before + 1
    graphs, runner.cuda_graphs = runner.cuda_graphs, None
    eager_logits = runner.compute_logits(step).float().cpu()
    runner.cuda_graphs = graphs
    err = ((graph_logits - eager_logits).abs().max() / eager_logits.abs().max()).item()
    print(f"{label}: decode logits graph vs eager, max relative difference {err:.2e}")
    assert not torch.isnan(graph_logits).any()
    assert err <= tol, f"{label}: {err:.2e} > {tol}"
    # end to end: generate replays graphs; float32 tokens equal the eager engine's
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    toks = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]
    assert runner.cuda_graphs.replays > before + 20
    del llm
    gc.collect()
    if dtype == "float32":
        eager = LLM(
            default_gguf,
            dtype=dtype,
            device="cuda",
            attention_backend=backend,
            attention_config=cfg,
            kv_cache_memory=1 << 30,
            enforce_eager=True,
        )
        assert eager.engine.runner.cuda_graphs is None
        assert [o.outputs[0].token_ids for o in eager.generate(PROMPTS, params)] == toks
        del eager
    torch.cuda.empty_cache()


def test_every_decode_step_replays_past_16_blocks(tiny_model_dir):
    """A max_model_len whose block count is not a multiple of 16 (400 tokens: 25 blocks): the decode steps past
    256 tokens (host tables 32 wide) replay the graphs too (before, every one of them ran eagerly)."""
    llm = LLM(
        tiny_model_dir("qwen3"), dtype="bfloat16", device="cuda", attention_backend="TRITON_ATTN", max_model_len=400
    )
    graphs = llm.engine.runner.cuda_graphs
    assert graphs is not None and graphs.block_table.shape[1] == 32
    before = graphs.replays
    params = SamplingParams(temperature=0.0, max_tokens=360, ignore_eos=True)
    out = llm.generate([[1] * 16], params)[0].outputs[0]
    assert len(out.token_ids) == 360
    assert graphs.replays - before == 359  # every decode step: the first token comes from the prefill
    del llm
    gc.collect()
    torch.cuda.empty_cache()


def test_flex_attention_runs_eagerly_with_reason(default_gguf, caplog):
    import logging

    caplog.set_level(logging.INFO, logger="attnserve.model_executor.model_runner")
    llm = LLM(default_gguf, dtype="float32", device="cuda", attention_backend="FLEX_ATTENTION", kv_cache_memory=1 << 30)
    assert llm.engine.runner.cuda_graphs is None
    assert "CUDA graphs off: FLEX_ATTENTION declares no CUDA-graph support" in caplog.text


# ------------------------------------------------------------------- FLASHINFER's replays, backend level
FI_SHAPES = [  # (num_heads, num_kv_heads, head_size, block_size, sliding_window); each compiles its kernels once
    (16, 8, 128, 16, None),  # Qwen3-0.6B: tensor-core decode; batch sizes on both sides of the split limit
    (8, 8, 128, 16, None),  # MHA: the CUDA-core decode kernel, plan() on every replay
]


def test_decode_longest_first_gives_the_request_order_tokens(tiny_model_dir):
    """TRITON_ATTN's decode calls take their requests longest context first (``triton_attn_plan.ORDER_DECODES``; in
    a graph sorted again on the device at every replay): float32 greedy tokens of prompts of different lengths
    equal those of the request order, with graphs and eagerly."""
    import attnserve.attention.backends.triton_attn_plan as plan

    prompts = [[1 + (i * 7 + j) % 50 for j in range(n)] for i, n in enumerate((5, 70, 33, 140, 1, 96))]
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    runs, default = {}, plan.ORDER_DECODES
    try:
        for ordered in (True, False):
            plan.ORDER_DECODES = ordered
            for eager in (False, True):
                llm = LLM(
                    tiny_model_dir("qwen3"),
                    dtype="float32",
                    device="cuda",
                    attention_backend="TRITON_ATTN",
                    enforce_eager=eager,
                    max_model_len=512,
                    max_num_seqs=8,
                    kv_cache_memory=1 << 28,  # the last LLM's cache may still sit in the allocator
                )
                graphs = llm.engine.runner.cuda_graphs
                before = 0 if graphs is None else graphs.replays
                runs[ordered, eager] = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
                if not eager:
                    assert graphs.replays - before >= 39
                del llm
                gc.collect()
                torch.cuda.empty_cache()
    finally:
        plan.ORDER_DECODES = default
    assert runs[True, False] == runs[False, False] == runs[True, True] == runs[False, True]


@pytest.mark.parametrize("hq,hkv,d,page,window", FI_SHAPES, ids=lambda x: str(x))
@torch.inference_mode()  # as the model runner runs (FlashInfer's plan() updates buffers made in inference mode)
def test_flashinfer_graph_replays_match_reference(hq, hkv, d, page, window):
    """CudaGraphRunner replays of FLASHINFER decode steps (two attention layers per graph) against the
    reference and the eager build, at batch sizes 1..64 and contexts 1..4k; replays never synchronise."""
    if not _has("flashinfer"):
        pytest.skip("flashinfer not installed")
    import numpy as np

    from attnserve.attention.backend import AttentionLayerSpec, CommonAttentionMetadata
    from attnserve.attention.backends.flashinfer import FlashInferBackend
    from attnserve.kernels.reference import reference_paged_attention
    from attnserve.model_executor.cuda_graph import CudaGraphRunner
    from attnserve.attention.forward_batch import ForwardBatch
    from attnserve.model_executor.forward_batch import HostBatch, PinnedStaging

    dev, dtype = torch.device("cuda"), torch.bfloat16
    torch.manual_seed(0)
    spec = AttentionLayerSpec(num_heads=hq, head_size=d, scale=d**-0.5, num_kv_heads=hkv, sliding_window=window)
    builder = FlashInferBackend.get_builder_cls()(spec, dev, dtype)
    impl = FlashInferBackend.get_impl_cls()(spec)
    max_model_len, sizes = 4096, [1, 2, 4, 8, 16, 32, 48, 64]
    max_blocks = max_model_len // page
    num_blocks = 64 * max_blocks // 4
    cache = torch.randn(FlashInferBackend.get_kv_cache_shape(num_blocks + 1, page, hkv, d), dtype=dtype, device=dev)
    q, k, v = (torch.randn(64, h, d, dtype=dtype, device=dev) for h in (hq, hkv, hkv))

    def forward(input_ids, positions, batch):  # two attention layers (on one cache)
        n = input_ids.shape[0]
        impl.forward(q[:n], k[:n], v[:n], cache, batch.attn_metadata)
        return impl.forward(q[:n], k[:n], v[:n], cache, batch.attn_metadata).view(n, -1)

    runner = CudaGraphRunner(
        forward,
        builder,
        [cache],
        sizes=sizes,
        device=dev,
        block_size=page,
        max_blocks=max_blocks,
        null_block=num_blocks,
        max_model_len=max_model_len,
    )
    runner.capture()
    modes = {bs: g.metadata.graph.replan for bs, g in runner.graphs.items()}
    print(f"split limit {builder.split_limit}, replan modes {modes}")
    for bs, mode in modes.items():
        want = ("none" if bs > builder.split_limit else "fast") if hq != hkv else "plan"
        assert mode == want, (bs, mode)
    staging, rng = PinnedStaging(dev), np.random.default_rng(0)
    for n, ctx_max in [(1, 1), (1, 4000), (3, 17), (7, 1000), (33, 600), (34, 300), (64, 1000), (50, 100)]:
        ctx = rng.integers(0, ctx_max, n)
        ctx[0] = ctx_max - 1
        blocks = -(-(ctx + 1) // page)
        ids = rng.permutation(num_blocks)[: blocks.sum()].astype(np.int32)
        table = np.zeros((n, blocks.max()), np.int32)
        for i, s in enumerate(np.cumsum(blocks) - blocks):
            table[i, : blocks[i]] = ids[s : s + blocks[i]]
        slots = table[np.arange(n), ctx // page].astype(np.int64) * page + ctx % page
        host = HostBatch(
            np.zeros(n, np.int64),
            ctx.astype(np.int64),
            slots,
            np.arange(n + 1, dtype=np.int32),
            (ctx + 1).astype(np.int32),
            table,
            n,
            1,
            int(ctx.max()) + 1,
        )
        before = runner.replays
        torch.cuda.set_sync_debug_mode("error")  # a replay's host work must not wait for the device
        try:
            out = runner.run(host, staging).view(n, hq, d).float()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert runner.replays == before + 1
        seq_lens = torch.from_numpy(host.seq_lens)
        ref = reference_paged_attention(
            q[:n].float(),
            cache.transpose(0, 1).float(),
            torch.arange(n + 1),
            seq_lens,
            torch.from_numpy(table),
            spec.scale,
            sliding_window=window,
        )
        err = ((out - ref.to(dev)).abs().max() / ref.abs().max()).item()
        # the same step eagerly (FlashInfer's non-graph wrappers)
        t = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
        common = CommonAttentionMetadata(
            t(host.query_start_loc).to(dev),
            t(host.query_start_loc),
            t(host.seq_lens).to(dev),
            t(host.seq_lens),
            t(table).to(dev),
            t(slots).to(dev),
            n,
            n,
            1,
            host.max_seq_len,
            n,
            n,
            page,
            t(table),
        )
        eager = (
            forward(torch.zeros(n, device=dev), None, ForwardBatch(None, None, None, builder.build(common), [cache]))
            .view(n, hq, d)
            .float()
        )
        err_eager = ((out - eager).abs().max() / eager.abs().max()).item()
        print(f"n={n} ctx<= {ctx_max}: graph vs reference {err:.2e}, vs eager {err_eager:.2e}")
        assert err < 2.5e-2 and err_eager < 2.5e-2, (n, err, err_eager)
