"""The FLASHINFER metadata builder's planning, on CPU with a stand-in FlashInfer (tests/attention/fake_flashinfer.py).

What the GPU cannot be asked cheaply: plan() gets host ``indptr``/``last_page_len``/``seq_lens`` and device
page ids (never a host page-id tensor, which FlashInfer copies with a blocking copy); the page arrays are
right (the fake's run() attends through them, compared with the reference); a CUDA-graph replay
re-plans only the batch sizes at or below FlashInfer's split limit (through the C++ planner, 20 arguments)
and plans nothing above it; the graph's prologue alone rebuilds the page arrays from the static buffers.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from attnserve.attention.backend import AttentionLayerSpec, CommonAttentionMetadata
from attnserve.attention.ops.paged_kv_indices import device_pages_torch, host_pages
from attnserve.attention.ops.reference import reference_paged_attention
from attnserve.config.attention import AttentionConfig
from tests.attention import fake_flashinfer
from tests.gpu.cases import Case, run_case


@pytest.fixture
def fake_fi(monkeypatch):
    """The fake flashinfer package, a CC 9.0 device with ``sms`` SMs (split limit 2 * sms // num_kv_heads)."""
    monkeypatch.setitem(sys.modules, "flashinfer", fake_flashinfer.module())
    state = SimpleNamespace(sms=132)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device=None: SimpleNamespace(multi_processor_count=state.sms))
    return state


def _backend():
    from attnserve.attention.backends.flashinfer import FlashInferBackend

    return FlashInferBackend


# ------------------------------------------------------------------------------------------- page arrays
def _naive(seq_lens, table, page):
    pages = [(int(s) + page - 1) // page for s in seq_lens]
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    last = np.array([int(s) - (p - 1) * page for s, p in zip(seq_lens, pages)], np.int32)
    indices = np.concatenate([np.asarray(table[i, :p]) for i, p in enumerate(pages)]).astype(np.int32)
    return indptr, last, indices


@pytest.mark.parametrize("n,width,page", [(1, 1, 16), (3, 8, 16), (64, 70, 16), (5, 4, 64), (300, 9, 16)])
def test_host_and_device_pages_match_the_definition(n, width, page):
    gen = torch.Generator().manual_seed(n)
    seq = torch.randint(1, width * page + 1, (n,), generator=gen, dtype=torch.int32)
    seq[0] = width * page  # a full last page and a full table row
    table = torch.randint(0, 10_000, (n, width), generator=gen, dtype=torch.int32)
    want_indptr, want_last, want_indices = _naive(seq, table, page)
    indptr, last = host_pages(seq.numpy(), page)
    assert (indptr == want_indptr).all() and (last == want_last).all()
    out_indptr, out_last = np.full(n + 5, -1, np.int32), np.full(n + 5, -1, np.int32)
    host_pages(seq.numpy(), page, out_indptr, out_last)  # into caller buffers (pinned views in the builder)
    assert (out_indptr[: n + 1] == want_indptr).all() and (out_last[:n] == want_last).all()
    d_indptr, d_last = torch.full((n + 3,), -7, dtype=torch.int32), torch.full((n + 2,), -7, dtype=torch.int32)
    d_indices = torch.full((n * width + 1,), -7, dtype=torch.int32)
    device_pages_torch(seq, table, page, d_indptr, d_last, d_indices)
    assert (d_indptr[: n + 1].numpy() == want_indptr).all() and (d_last[:n].numpy() == want_last).all()
    assert (d_indices[: want_indptr[-1]].numpy() == want_indices).all()


def test_triton_device_pages_in_interpreter(tmp_path):
    """The Triton kernel against the definition, under the Triton interpreter (a subprocess: the interpreter
    mode is fixed when Triton's kernels are decorated)."""
    pytest.importorskip("triton")
    import os
    import subprocess

    code = (
        "import numpy as np, torch\n"
        "from attnserve.attention.ops.triton_paged_kv_indices import device_pages_triton\n"
        "from attnserve.attention.ops.paged_kv_indices import device_pages_torch\n"
        "g = torch.Generator().manual_seed(0)\n"
        "for n, w, p in [(1, 1, 16), (3, 8, 16), (64, 70, 16), (5, 4, 64), (300, 9, 16), (2, 300, 16), (700, 3, 16)]:\n"
        "    seq = torch.randint(1, w * p + 1, (n,), generator=g, dtype=torch.int32)\n"
        "    table = torch.randint(0, 10000, (n, w), generator=g, dtype=torch.int32)\n"
        "    outs = []\n"
        "    for fn in (device_pages_torch, device_pages_triton):\n"
        "        a, b, c = (torch.full((k,), -7, dtype=torch.int32) for k in (n + 1, n, n * w + 1))\n"
        "        fn(seq, table, p, a, b, c)\n"
        "        outs.append((a, b, c[: int(a[-1])]))\n"
        "    assert all(torch.equal(x, y) for x, y in zip(*outs)), (n, w, p)\n"
        "print('ok')\n")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": root})
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]


# ------------------------------------------------------------------------------------------- eager steps
EAGER = [Case("decode_b1_ctx1"), Case("decode_b64"), Case("prefill"), Case("mixed"),
         Case("mixed", prefill_decode=True), Case("decode_b64", num_heads=8, num_kv_heads=8),
         Case("mixed", num_heads=32, num_kv_heads=4, head_size=64, block_size=64)]


@pytest.mark.parametrize("case", [Case(c.shape, c.num_heads, c.num_kv_heads, c.head_size, c.block_size, torch.float32,
                                       prefill_decode=c.prefill_decode) for c in EAGER], ids=lambda c: c.name)
def test_eager_steps_match_reference(fake_fi, case):
    res = run_case(_backend(), case, "cpu", AttentionConfig(), small=True)
    assert res["pass"], res


def test_eager_plan_arguments(fake_fi):
    """Host indptr/last_page_len/seq_lens, device page ids; decode wrapper named fa2 for 16-bit KV."""
    backend = _backend()
    spec = AttentionLayerSpec(num_heads=4, head_size=8, scale=8 ** -0.5, num_kv_heads=2)
    b = backend.get_builder_cls()(spec, torch.device("cpu"), torch.float32)
    assert b.decode._backend == "fa2" and b.tensor_cores
    seq = torch.tensor([5, 40, 17], dtype=torch.int32)
    table = torch.tensor([[3, 0, 0], [4, 5, 6], [7, 8, 0]], dtype=torch.int32)
    common = CommonAttentionMetadata(
        query_start_loc=torch.arange(4, dtype=torch.int32), query_start_loc_cpu=torch.arange(4, dtype=torch.int32),
        seq_lens=seq, seq_lens_cpu=seq.clone(), block_table=table, slot_mapping=torch.zeros(3, dtype=torch.int64),
        num_reqs=3, num_actual_tokens=3, max_query_len=1, max_seq_len=40, num_decodes=3, num_decode_tokens=3,
        block_size=16)
    for step in range(3):  # the pinned host buffers rotate between steps
        b.build(common)
        plan = b.decode.plans[-1]
        assert plan["indptr"].tolist() == [0, 1, 4, 6] and plan["last"].tolist() == [5, 8, 1]
        assert b.decode._paged_kv_indices_buf.tolist() == [3, 4, 5, 6, 7, 8]
    ptrs = [p["pinned"].data_ptr() for p in b.decode.plans]
    assert ptrs[0] != ptrs[1] and ptrs[0] == ptrs[2]  # two sets of host buffers, in turn


# ------------------------------------------------------------------------------------------- CUDA graphs
class SimulatedGraphs:
    """CudaGraphRunner's host side without CUDA: static buffers, buckets, padding rows (context 1, the null
    block); a "replay" is prepare_cudagraph_replay, then the captured work: the prologue and the forward."""

    def __init__(self, builder, impl, kv_cache, sizes, max_blocks, null_block, block_size):
        self.builder, self.impl, self.kv_cache = builder, impl, kv_cache
        self.sizes, self.null, self.bs = sorted(sizes), null_block, block_size
        n = self.sizes[-1]
        self.seq_lens = torch.ones(n, dtype=torch.int32)
        self.block_table = torch.full((n, max_blocks), null_block, dtype=torch.int32)
        self.slots = torch.full((n,), null_block * block_size, dtype=torch.int64)
        self.qsl = torch.arange(n + 1, dtype=torch.int32)
        self.meta = {}
        for s in reversed(self.sizes):
            common = self._common(s, torch.ones(s, dtype=torch.int32), 1 << 20)
            self.meta[s] = builder.build_for_cudagraph_capture(common)

    def _common(self, s, seq_lens_cpu, max_seq_len):
        return CommonAttentionMetadata(
            query_start_loc=self.qsl[: s + 1], query_start_loc_cpu=torch.arange(s + 1, dtype=torch.int32),
            seq_lens=self.seq_lens[:s], seq_lens_cpu=seq_lens_cpu, block_table=self.block_table[:s],
            slot_mapping=self.slots[:s], num_reqs=s, num_actual_tokens=s, max_query_len=1, max_seq_len=max_seq_len,
            num_decodes=s, num_decode_tokens=s, block_size=self.bs)

    def replay(self, seq_lens, table, slots, q, k, v):
        n = len(seq_lens)
        s = next(x for x in self.sizes if x >= n)
        pad = s - n
        lens = torch.cat([seq_lens, torch.ones(pad, dtype=torch.int32)])
        self.seq_lens[:s] = lens
        self.block_table[:n, : table.shape[1]] = table
        self.block_table[n:s] = self.null
        self.slots[:n], self.slots[n:s] = slots, self.null * self.bs
        meta = self.meta[s]
        self.builder.prepare_cudagraph_replay(meta, self._common(s, lens.clone(), int(lens.max())))
        # -- the graph --
        self.builder.cudagraph_prologue(meta)
        qp, kp, vp = (torch.cat([x, x.new_zeros(pad, *x.shape[1:])]) for x in (q, k, v))
        return self.impl.forward(qp, kp, vp, self.kv_cache, meta)[:n], meta


def _graph_setup(fake_fi, num_heads, num_kv_heads, sms, sizes=(1, 2, 4, 8, 16), sliding_window=None):
    fake_fi.sms = sms
    backend = _backend()
    d, page = 16, 16
    spec = AttentionLayerSpec(num_heads=num_heads, head_size=d, scale=d ** -0.5, num_kv_heads=num_kv_heads,
                              sliding_window=sliding_window)
    builder = backend.get_builder_cls()(spec, torch.device("cpu"), torch.float32)
    impl = backend.get_impl_cls()(spec)
    num_blocks, max_blocks = 200, 16
    gen = torch.Generator().manual_seed(0)
    kv_cache = torch.randn(backend.get_kv_cache_shape(num_blocks + 1, page, num_kv_heads, d), generator=gen)
    graphs = SimulatedGraphs(builder, impl, kv_cache, list(sizes), max_blocks, num_blocks, page)
    return graphs, builder, spec, gen, page, num_blocks


def _step(graphs, spec, gen, page, num_blocks, ctx):
    """One decode step of len(ctx) requests with those contexts: replayed output vs reference."""
    n = len(ctx)
    seq = torch.tensor(ctx, dtype=torch.int32) + 1
    width = int((seq.max() + page - 1) // page)
    perm = torch.randperm(num_blocks, generator=gen)[: n * width].view(n, width).to(torch.int32)
    slots = torch.tensor([int(perm[i, c // page]) * page + c % page for i, c in enumerate(ctx)])
    q = torch.randn(n, spec.num_heads, spec.head_size, generator=gen)
    k = torch.randn(n, spec.num_kv_heads, spec.head_size, generator=gen)
    v = torch.randn(n, spec.num_kv_heads, spec.head_size, generator=gen)
    out, meta = graphs.replay(seq, perm, slots, q, k, v)
    cache = graphs.kv_cache.transpose(0, 1)
    ref = reference_paged_attention(q, cache, torch.arange(n + 1), seq, perm, spec.scale,
                                    sliding_window=spec.sliding_window)
    err = (out - ref).abs().max().item()
    assert err < 1e-4, err
    return meta


@pytest.mark.parametrize("num_heads,num_kv_heads", [(8, 2), (4, 4)], ids=["gqa4", "mha"])
def test_graph_replays_match_reference_and_replan_only_split_sizes(fake_fi, num_heads, num_kv_heads):
    # 4 SMs: FlashInfer's split limit is 2 * 4 // Hkv requests (4 for GQA 8/2, 2 for MHA)
    graphs, builder, spec, gen, page, nb = _graph_setup(fake_fi, num_heads, num_kv_heads, sms=4)
    limit = 8 // num_kv_heads
    assert builder.split_limit == limit
    for s, meta in graphs.meta.items():
        g, w = meta.graph, meta.graph.wrapper
        assert w.plans[0]["disable_split_kv"] == (builder.tensor_cores and s > limit)
        want = ("none" if s > limit else "fast") if builder.tensor_cores else "plan"
        assert g.replan == want, (s, g.replan)
    for ctx in ([0], [15, 16], [3, 40, 150], [100] * 5, [7, 0, 33, 64, 120, 1, 2, 90, 5], list(range(0, 160, 10))):
        meta = _step(graphs, spec, gen, page, nb, ctx)
        g, w = meta.graph, meta.graph.wrapper
        if g.replan == "none":
            assert len(w.plans) == 1 and not w._cached_module.calls  # planned at capture only
        elif g.replan == "fast":
            assert len(w.plans) == 1 and w._cached_module.calls  # the C++ planner, no plan()
            args = w._cached_module.calls[-1]
            assert args[4].tolist() == host_pages(args[5].numpy(), page)[0].tolist()
        else:
            assert len(w.plans) >= 2
    # the fast re-plans alternate between the two pinned host workspaces
    w = graphs.meta[1].graph.wrapper
    if builder.tensor_cores:
        _step(graphs, spec, gen, page, nb, [33])
        calls = w._cached_module.calls
        assert calls[-1][2].data_ptr() != calls[-2][2].data_ptr()


def test_graph_prologue_alone_rebuilds_pages(fake_fi):
    """A batch size that plans nothing at replay still attends over the step's pages: the prologue writes
    the wrapper's buffers from the static seq_lens and block table."""
    graphs, builder, spec, gen, page, nb = _graph_setup(fake_fi, 8, 2, sms=1, sizes=(4, 8))  # split limit 1
    for ctx in ([5, 6, 7], [200, 3, 77, 16, 31], [64] * 8):
        meta = _step(graphs, spec, gen, page, nb, ctx)
        assert meta.graph.replan == "none"
        assert graphs.meta[4].graph.wrapper.plans.__len__() == 1


def test_graph_sliding_window(fake_fi):
    graphs, builder, spec, gen, page, nb = _graph_setup(fake_fi, 8, 2, sms=4, sliding_window=40)
    for ctx in ([0], [100, 3], [150, 20, 64, 9, 100]):
        _step(graphs, spec, gen, page, nb, ctx)


def test_fast_plan_falls_back_to_plan_on_a_planner_it_cannot_call(fake_fi, caplog):
    graphs, builder, spec, gen, page, nb = _graph_setup(fake_fi, 8, 2, sms=4)
    w = graphs.meta[2].graph.wrapper

    def other_signature(*args):
        raise TypeError("plan() takes 18 positional arguments but 20 were given")

    w._cached_module.plan = other_signature
    meta = _step(graphs, spec, gen, page, nb, [10, 20])
    assert meta.graph.replan == "plan" and builder.fast_plan_error.startswith("TypeError")
    assert len(w.plans) == 2  # plan() at capture and now
    assert "fast re-plan failed" in caplog.text
    _step(graphs, spec, gen, page, nb, [10, 20])


def test_fast_plan_refuses_a_changed_launch_layout(fake_fi):
    graphs, builder, spec, gen, page, nb = _graph_setup(fake_fi, 8, 2, sms=4)
    w = graphs.meta[1].graph.wrapper
    w._layout_info = lambda bs, disable: [bs, 1, 999]
    with pytest.raises(RuntimeError, match="changed its launch layout"):
        _step(graphs, spec, gen, page, nb, [10])
