"""CUDA graphs for decode steps: one captured forward pass per batch-size bucket, replayed with new inputs.

A pure-decode step of ``n`` requests (every query length 1) runs the graph of the smallest captured batch
size ``bs >= n``; rows ``n..bs`` are padding: token 0 at position 0, context length 1, their one block the
runner's spare *null block* (never handed to the scheduler), so their K/V writes and reads touch no
request's cache. Every input lives in a static device buffer that the graphs were captured on; a replay
copies the step's values into those buffers (non-blocking, from pinned memory, on a side stream), lets the
backend's metadata builder refresh whatever it plans on the host (FlashInfer's ``plan()``, for the batch
sizes where its split-KV schedule depends on the context lengths), and replays. Each graph starts with the builder's
``cudagraph_prologue`` (FlashInfer: its page arrays, rebuilt on the device from the static buffers). Steps
with a prefill, or more requests than the largest bucket, run eagerly.

Cascade graphs (``cascade=True``: prefix caching on and a builder that ``supports_cascade``): a second graph
for each bucket of at least ``cascade.MIN_REQS`` requests, whose attention reads a prefix all requests share
once (``attention/cascade.py``). A replay whose requests share at least ``cascade.MIN_PREFIX_TOKENS`` tokens
of leading blocks copies the prefix's blocks and length into their own static buffers, each request's
remaining blocks and length into the usual ones, and replays that graph.

The input copies run on their own stream (``input_stream``), waiting only for the previous replay to have
read the buffers: with async scheduling the host queues step k+1 while the GPU runs step k, and the copies
then overlap step k's LM head and sampling instead of sitting, one copy-engine round trip each, between
step k's argmax and step k+1's first kernel (five copies; ``benchmarks/gpu/profile_engine_steps.py``).

As in vLLM (``vllm/v1/worker/gpu_model_runner.py``, ``capture_model``) and nano-vllm (``model_runner.py``,
``capture_cudagraph``): buckets 1, 2, 4, 8, then multiples of 16; captured largest first into one shared
memory pool; the logits are computed eagerly after the replay (one matmul) from the captured hidden states.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from attnserve.attention import cascade as cascade_rules
from attnserve.attention.backend import AttentionMetadataBuilder, CommonAttentionMetadata
from attnserve.attention.cascade import CascadePrefix
from attnserve.attention.forward_batch import ForwardBatch
from attnserve.model_executor.block_tables import table_width
from attnserve.model_executor.forward_batch import HostBatch, PinnedStaging

logger = logging.getLogger(__name__)

# the largest decode batch captured by default (vLLM's default max capture size)
MAX_CAPTURE_SIZE = 512


def capture_sizes(max_num_seqs: int, limit: int = MAX_CAPTURE_SIZE) -> list[int]:
    """Batch-size buckets: 1, 2, 4, 8, 16, 32, 48, ... up to ``min(max_num_seqs, limit)`` (always included)."""
    top = max(1, min(max_num_seqs, limit))
    sizes = [s for s in (1, 2, 4, 8) if s <= top] + list(range(16, top + 1, 16))
    if sizes[-1] != top:
        sizes.append(top)
    return sizes


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    metadata: Any  # the backend metadata the graph was captured with (kept alive with it)
    common: CommonAttentionMetadata
    cascade: CascadePrefix | None = None


class CudaGraphRunner:
    """Captures ``forward(input_ids, positions, batch) -> hidden (T, H)`` for decode batch-size buckets.

    ``H`` and the dtype of the graphs' output buffer are those of the forward's own output in the first
    warm-up run: the LM head's input width, which is not always the hidden size (OPT-350m projects 1024 down
    to 512 before it).

    ``forward`` is the model's forward pass (every rank of a tensor-parallel group captures the same buckets
    in the same order, so the collectives inside the graphs meet). ``null_block`` is a KV-cache block id no
    request uses; ``max_blocks`` the most blocks a request holds (``ceil(max_model_len / block_size)``): the static
    block table is ``block_tables.table_width(max_blocks)`` wide, as wide as a step's host table can be.
    """

    def __init__(
        self,
        forward: Callable[[torch.Tensor, torch.Tensor, ForwardBatch], torch.Tensor],
        builder: AttentionMetadataBuilder,
        kv_caches: list[torch.Tensor],
        *,
        sizes: list[int],
        device: torch.device,
        block_size: int,
        max_blocks: int,
        null_block: int,
        max_model_len: int,
        cascade: bool = False,
    ) -> None:
        self.forward = forward
        self.builder = builder
        self.kv_caches = kv_caches
        self.sizes = sorted(sizes)
        self.max_size = self.sizes[-1]
        self.device = device
        self.block_size = block_size
        self.null_block = null_block
        self.max_model_len = max_model_len
        n, dev = self.max_size, device
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(n, dtype=torch.int64, device=dev)
        self.slot_mapping = torch.full((n,), null_block * block_size, dtype=torch.int64, device=dev)
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=dev)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=dev)
        max_blocks = table_width(max_blocks)  # a host table's width is rounded so (``block_tables.py``)
        self.block_table = torch.full((n, max_blocks), null_block, dtype=torch.int32, device=dev)
        self.hidden: torch.Tensor | None = None  # (max_size, H): allocated by the first warm-up run
        self.graphs: dict[int, _Graph] = {}
        self.cascade_graphs: dict[int, _Graph] = {}  # bucket -> its cascade graph (see the module docstring)
        self.cascade = cascade
        # the shared prefix of a cascade replay: its block ids and its length in tokens
        self.prefix_table = torch.full((1, max_blocks), null_block, dtype=torch.int32, device=dev)
        self.prefix_lens = torch.full((1,), block_size, dtype=torch.int32, device=dev)
        self.cascade_replays = 0
        self.capture_seconds = 0.0
        self.replays = 0  # decode steps run as a graph replay so far
        # the inputs' copies: their own stream (None: the current stream, in line with the step's kernels)
        self.input_stream: torch.cuda.Stream | None = torch.cuda.Stream(device)
        self._inputs_ready = torch.cuda.Event()  # recorded on input_stream after a step's copies
        self._replayed: torch.cuda.Event | None = None  # recorded after the last replay: its inputs are read

    def bucket(self, num_reqs: int) -> int | None:
        """The smallest captured batch size holding ``num_reqs`` requests, or None."""
        for s in self.sizes:
            if s >= num_reqs:
                return s
        return None

    def can_run(self, host: HostBatch) -> bool:
        return (
            host.is_pure_decode
            and host.num_reqs <= self.max_size
            and bool(self.graphs)
            and host.block_table.shape[1] <= self.block_table.shape[1]
        )

    def _common(
        self,
        bs: int,
        seq_lens_cpu: torch.Tensor,
        block_table_cpu: torch.Tensor | None,
        max_seq_len: int,
        cascade: CascadePrefix | None = None,
    ) -> CommonAttentionMetadata:
        return CommonAttentionMetadata(
            query_start_loc=self.query_start_loc[: bs + 1],
            query_start_loc_cpu=torch.arange(bs + 1, dtype=torch.int32),
            seq_lens=self.seq_lens[:bs],
            seq_lens_cpu=seq_lens_cpu,
            block_table=self.block_table[:bs],
            slot_mapping=self.slot_mapping[:bs],
            num_reqs=bs,
            num_actual_tokens=bs,
            max_query_len=1,
            max_seq_len=max_seq_len,
            num_decodes=bs,
            num_decode_tokens=bs,
            block_size=self.block_size,
            block_table_cpu=block_table_cpu,
            cascade=cascade,
        )

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every bucket, largest first, into one memory pool (two warm-up runs each first)."""
        t0 = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        for bs in sorted(self.sizes, reverse=True):
            self.graphs[bs] = self._capture_one(bs, pool, None)
            if self.cascade and bs >= cascade_rules.MIN_REQS:
                qsl = torch.tensor([0, bs], dtype=torch.int32, device=self.device)
                prefix = CascadePrefix(
                    self.prefix_table, self.prefix_lens, qsl, self.prefix_table.shape[1] * self.block_size
                )
                self.cascade_graphs[bs] = self._capture_one(bs, pool, prefix)
        torch.cuda.synchronize(self.device)
        self.capture_seconds = time.perf_counter() - t0

    def _capture_one(self, bs: int, pool, prefix: CascadePrefix | None) -> _Graph:
        """Capture bucket ``bs`` (with a shared ``prefix``: its cascade graph) after two warm-up runs."""
        # capture as if the longest context were present: host-chosen launch shapes (split-KV counts)
        # must cover every replay
        common = self._common(
            bs,
            torch.ones(bs, dtype=torch.int32),
            torch.full((bs, 1), self.null_block, dtype=torch.int32),
            self.max_model_len,
            prefix,
        )
        metadata = self.builder.build_for_cudagraph_capture(common)
        batch = ForwardBatch(
            self.input_ids[:bs], self.positions[:bs], self.query_start_loc[1 : bs + 1] - 1, metadata, self.kv_caches
        )

        def step() -> None:
            self.builder.cudagraph_prologue(metadata)
            out = self.forward(self.input_ids[:bs], self.positions[:bs], batch)
            if self.hidden is None:  # the largest bucket's first warm-up run, outside any capture
                self.hidden = out.new_zeros(self.max_size, out.shape[-1])
            self.hidden[:bs] = out

        for _ in range(2):  # compiles Triton kernels and sets up cuBLAS outside the capture
            step()
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            step()
        return _Graph(graph, metadata, common, prefix)

    def run(
        self, host: HostBatch, staging: PinnedStaging, fill_input_ids: Callable[[torch.Tensor], Any] | None = None
    ) -> torch.Tensor:  # (n, hidden)
        """Replay the bucket of ``host`` (a pure-decode step) with its inputs; the hidden states of its rows.

        ``fill_input_ids``: called with the static ``input_ids`` (bs,) after the copy, before the replay, to
        write token ids that live on the device (async scheduling's placeholders).
        """
        n = host.num_reqs
        bs = self.bucket(n)
        g = self.graphs[bs]
        table, lens = host.block_table, host.seq_lens
        shared = (
            cascade_rules.common_prefix_blocks(table, lens - 1, self.block_size) if bs in self.cascade_graphs else 0
        )
        prefix_blocks = shared if cascade_rules.use_cascade(n, shared, self.block_size) else 0
        if prefix_blocks:
            g = self.cascade_graphs[bs]
            table, lens = table[:, prefix_blocks:], lens - prefix_blocks * self.block_size
        w = table.shape[1]
        pad = bs - n
        ids = np.concatenate([host.input_ids, np.zeros(pad, np.int64)]) if pad else host.input_ids
        pos = np.concatenate([host.positions, np.zeros(pad, np.int64)]) if pad else host.positions
        slots = (
            np.concatenate([host.slot_mapping, np.full(pad, self.null_block * self.block_size, np.int64)])
            if pad
            else host.slot_mapping
        )
        lens = np.concatenate([lens, np.ones(pad, np.int32)]) if pad else lens
        if pad:
            table = np.concatenate([table, np.full((pad, w), self.null_block, np.int32)])
        staging.begin()
        main = torch.cuda.current_stream(self.device)
        copies = self.input_stream or main
        with torch.cuda.stream(copies):
            if self._replayed is not None and copies is not main:
                copies.wait_event(self._replayed)  # the last replay has read the buffers we overwrite
            self.input_ids[:bs].copy_(staging.pinned("g_ids", ids), non_blocking=True)
            self.positions[:bs].copy_(staging.pinned("g_pos", pos), non_blocking=True)
            self.slot_mapping[:bs].copy_(staging.pinned("g_slots", slots), non_blocking=True)
            lens_cpu = staging.pinned("g_lens", lens)
            self.seq_lens[:bs].copy_(lens_cpu, non_blocking=True)
            table_cpu = staging.pinned("g_table", table)
            self.block_table[:bs, :w].copy_(table_cpu, non_blocking=True)
            if prefix_blocks:
                prefix_row = host.block_table[:1, :prefix_blocks]
                self.prefix_table[:, :prefix_blocks].copy_(staging.pinned("g_prefix", prefix_row), non_blocking=True)
                prefix_len = np.array([prefix_blocks * self.block_size], np.int32)
                self.prefix_lens.copy_(staging.pinned("g_prefix_len", prefix_len), non_blocking=True)
        if copies is not main:
            self._inputs_ready.record(copies)
            main.wait_event(self._inputs_ready)
        staging.end()  # on the main stream, after the wait: covers this step's copies on both streams
        if fill_input_ids is not None:
            fill_input_ids(self.input_ids[:bs])
        max_seq_len = host.max_seq_len - prefix_blocks * self.block_size
        common = self._common(bs, lens_cpu, table_cpu, max_seq_len, g.cascade)
        self.builder.prepare_cudagraph_replay(g.metadata, common)
        g.graph.replay()
        self.cascade_replays += bool(prefix_blocks)
        if self._replayed is None:
            self._replayed = torch.cuda.Event()
        self._replayed.record(main)
        self.replays += 1
        return self.hidden[:n]
