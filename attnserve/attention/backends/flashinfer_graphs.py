"""FLASHINFER's CUDA-graph decode planning: the captured wrappers and their re-plans per replay.

CUDA graphs (pure decode): one ``use_cuda_graph`` wrapper per batch size whose graph rebuilds the page arrays
itself (``cudagraph_prologue``); replays re-plan only where the split-KV schedule depends on the context
lengths (see ``FlashInferGraphPlanner.build_for_cudagraph_capture``). :class:`FlashInferGraphPlanner` is owned by
:class:`~attnserve.attention.backends.flashinfer.FlashInferMetadataBuilder`, whose CUDA-graph hooks delegate to it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from attnserve.attention.backend import CommonAttentionMetadata
from attnserve.attention.backends.flashinfer import FlashInferCall, FlashInferMetadata, _workspace
from attnserve.kernels.paged_kv_indices import device_pages, host_pages
from attnserve.attention.ops.pinned_ring import PinnedRing

if TYPE_CHECKING:
    from attnserve.attention.backends.flashinfer import FlashInferMetadataBuilder

logger = logging.getLogger(__name__)


@dataclass
class FlashInferGraph:
    """The decode wrapper of one captured batch size and what its replays need.

    ``replan`` says how a replay refreshes the wrapper's host-planned schedule: ``"none"`` (the schedule
    does not depend on the context lengths: planned once at capture with split-KV off), ``"fast"`` (the
    tensor-core kernel's C++ planner called directly, no Python plan()) or ``"plan"`` (FlashInfer's
    ``plan()``: the CUDA-core decode kernel, or a kernel other than fa2). The page arrays themselves are
    rebuilt inside the graph (``cudagraph_prologue``) from the runner's static ``seq_lens``/``block_table``.
    """

    wrapper: Any
    batch_size: int
    block_size: int
    seq_lens: torch.Tensor  # the runner's static (bs,) buffer
    block_table: torch.Tensor  # the runner's static (bs, W) buffer
    indptr: torch.Tensor  # (bs + 1,) the wrapper's buffers, written by the prologue
    last_page_len: torch.Tensor  # (bs,)
    indices: torch.Tensor  # (bs * W + 1,)
    replan: str
    plan_info: list[int] | None = None  # what the capture's plan() returned (the graph's kernel arguments)
    qo_indptr: torch.Tensor | None = None  # (bs + 1,) arange on the host, for the fast plan


class _PlanChanged(RuntimeError):
    """A replay's plan differs from the captured one in what the graph's kernels were launched with."""


# FlashInfer's batch-prefill planner (the tensor-core decode's) budgets 2 CTAs per SM
# (PrefillPlanImpl in include/flashinfer/attention/scheduler.cuh: num_blocks_per_sm = 2) and splits a
# request's KV only while batch_size * num_kv_heads leaves SMs idle: past max_batch_size_if_split =
# 2 * num_SMs // num_kv_heads requests every request is one chunk whatever its length.
_PLANNER_CTAS_PER_SM = 2


class FlashInferGraphPlanner:
    """The CUDA-graph decode path of one :class:`FlashInferMetadataBuilder`: the captured wrappers' page
    buffers, the pinned buffers of replay re-plans, and FlashInfer's split limit. It reads the builder's
    layer spec, dtypes and wrapper settings."""

    def __init__(self, builder: FlashInferMetadataBuilder) -> None:
        self.builder = builder
        sms = torch.cuda.get_device_properties(builder.device).multi_processor_count
        self.split_limit = _PLANNER_CTAS_PER_SM * sms // builder.layer_spec.num_kv_heads
        self.ring = PinnedRing(builder.device.type == "cuda")
        self._graph_bufs: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self.fast_plan_error: str | None = None  # why replays fell back to plan(), if they did

    def build_for_cudagraph_capture(self, common: CommonAttentionMetadata) -> FlashInferMetadata:
        """A CUDA-graph decode wrapper for this batch size (FlashInfer's ``use_cuda_graph=True``: fixed
        batch size, page arrays in fixed buffers), planned once here.

        The page arrays are rebuilt at the head of every replay from the runner's static buffers
        (:meth:`cudagraph_prologue`). Whether a replay re-plans depends on the batch size: above FlashInfer's
        split limit (``2 * SMs // num_kv_heads`` requests, 33 for 8 KV heads on 132 SMs) its planner never
        splits a request's KV, so the tensor-core wrapper is planned with ``disable_split_kv=True``: the
        same one-chunk-per-request work, no merge kernel, and a schedule that does not depend on the context
        lengths: replays plan nothing. At or below the limit the split count follows the longest context,
        and each replay re-plans (the C++ planner directly, :meth:`_fast_plan`). The buffers are shared by
        every batch size's wrapper: only one graph runs at a time.
        """
        import flashinfer

        b = self.builder
        spec, bs = b.layer_spec, common.num_reqs
        need = bs * common.block_table.shape[1] + 1  # + the device builder's scratch entry
        if self._graph_bufs is None or self._graph_bufs[2].numel() < need or self._graph_bufs[0].numel() < bs + 1:
            # the first (largest) capture sizes them
            self._graph_bufs = (
                torch.zeros(bs + 1, dtype=torch.int32, device=b.device),
                torch.ones(bs, dtype=torch.int32, device=b.device),
                torch.zeros(need, dtype=torch.int32, device=b.device),
            )
        indptr, last_len, indices = self._graph_bufs[0][: bs + 1], self._graph_bufs[1][:bs], self._graph_bufs[2][:need]
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            _workspace(b.device),
            b.kv_cache_layout.value,
            use_cuda_graph=True,
            use_tensor_cores=b.tensor_cores,
            backend=b.decode_backend,
            paged_kv_indptr_buffer=indptr,
            paged_kv_indices_buffer=indices,
            paged_kv_last_page_len_buffer=last_len,
        )
        split = bs <= self.split_limit
        g = FlashInferGraph(
            wrapper, bs, common.block_size, common.seq_lens, common.block_table, indptr, last_len, indices, "plan"
        )
        b.cudagraph_prologue(
            FlashInferMetadata(common.slot_mapping, [], common.query_start_loc, common.seq_lens, common.block_table, g)
        )
        host_indptr, host_last = host_pages(common.seq_lens_cpu.numpy(), common.block_size)
        extra = dict(disable_split_kv=not split) if b.tensor_cores else {}
        wrapper.plan(
            torch.from_numpy(host_indptr),
            indices[: int(host_indptr[-1])],
            torch.from_numpy(host_last),
            spec.num_heads,
            spec.num_kv_heads,
            spec.head_size,
            common.block_size,
            window_left=b.window_left,
            logits_soft_cap=spec.logits_soft_cap,
            q_data_type=b.decode_q_dtype,
            kv_data_type=b.kv_dtype,
            o_data_type=b.dtype,
            sm_scale=spec.scale,
            seq_lens=common.seq_lens_cpu,
            **extra,
        )
        try:  # the launch layout the graph's kernels get (FlashInfer's PrefillPlanInfo as a list)
            g.plan_info = [int(x) for x in wrapper._plan_info]
        except Exception:  # noqa: BLE001 - none, or not a list of ints: no fast re-plan
            g.plan_info = None
        fa2 = (
            b.tensor_cores
            and getattr(wrapper, "_backend", None) == "fa2"
            and getattr(wrapper, "_jit_module", None) is None
            and g.plan_info is not None
        )
        if fa2 and not split:
            g.replan = "none"
        elif fa2 and self.fast_plan_error is None:
            g.replan = "fast"
            g.qo_indptr = torch.arange(bs + 1, dtype=torch.int32)
        if g.replan != "none":
            ring = self.ring
            ring.reserve("plan", wrapper._int_workspace_buffer.numel(), torch.uint8)
            ring.reserve("indptr", bs + 1)
            ring.reserve("last", bs)
        return FlashInferMetadata(
            common.slot_mapping,
            [FlashInferCall("decode", 0, bs, wrapper, q_dtype=b.decode_q_dtype)],
            common.query_start_loc,
            common.seq_lens,
            common.block_table,
            g,
        )

    def cudagraph_prologue(self, metadata: FlashInferMetadata) -> None:
        """The page arrays of this replay, from the static ``seq_lens`` and block table (one kernel)."""
        g = metadata.graph
        device_pages(g.seq_lens, g.block_table, g.block_size, g.indptr, g.last_page_len, g.indices)

    def prepare_cudagraph_replay(self, metadata: FlashInferMetadata, common: CommonAttentionMetadata) -> None:
        """Re-plan the split-KV schedule when this batch size's depends on the context lengths; nothing
        otherwise. No host-device synchronisation either way."""
        g = metadata.graph
        if g.replan == "none":
            return
        ring = self.ring
        ring.acquire()
        n = g.batch_size
        indptr, last_len = ring.buffer("indptr", n + 1), ring.buffer("last", n)
        host_pages(common.seq_lens_cpu.numpy(), common.block_size, indptr.numpy(), last_len.numpy())
        pinned = ring.buffer("plan", g.wrapper._int_workspace_buffer.numel(), torch.uint8)
        if g.replan == "fast":
            try:
                self._fast_plan(g, indptr, common.seq_lens_cpu, common.block_size, pinned)
            except _PlanChanged:
                raise
            except Exception as e:  # another FlashInfer version's planner signature: plan() from now on
                self.fast_plan_error = f"{type(e).__name__}: {e}"
                logger.warning(
                    "FlashInfer fast re-plan failed (%s); CUDA-graph replays call plan()", self.fast_plan_error
                )
                g.replan = "plan"
        if g.replan == "plan":
            b = self.builder
            spec = b.layer_spec
            g.wrapper._pin_memory_int_workspace_buffer = pinned
            # the indices argument is the wrapper's own buffer (the prologue fills it): plan() copies nothing
            g.wrapper.plan(
                indptr,
                g.indices[: int(indptr[n])],
                last_len,
                spec.num_heads,
                spec.num_kv_heads,
                spec.head_size,
                common.block_size,
                window_left=b.window_left,
                logits_soft_cap=spec.logits_soft_cap,
                q_data_type=b.decode_q_dtype,
                kv_data_type=b.kv_dtype,
                o_data_type=b.dtype,
                sm_scale=spec.scale,
                seq_lens=common.seq_lens_cpu,
                **(dict(disable_split_kv=False) if b.tensor_cores else {}),
            )
        ring.release()

    def _fast_plan(
        self, g: FlashInferGraph, indptr: torch.Tensor, seq_lens: torch.Tensor, block_size: int, pinned: torch.Tensor
    ) -> None:
        """The tensor-core decode wrapper's plan() reduced to its C++ planner call (FlashInfer 0.7.2,
        ``BatchDecodeWithPagedKVCacheWrapper._plan_impl``'s tensor-core branch; as vLLM's
        ``fast_plan_decode``): the arguments the captured graph was planned with but the context
        lengths. The page buffers need no copy (the graph's prologue fills them). The planner writes the
        schedule into ``pinned`` and copies it to the wrapper's int workspace without blocking."""
        b = self.builder
        spec, w, n = b.layer_spec, g.wrapper, g.batch_size
        args = [
            w._float_workspace_buffer,
            w._int_workspace_buffer,
            pinned,
            g.qo_indptr,
            indptr,
            seq_lens,
            n,
            n,
            spec.num_heads,
            spec.num_kv_heads,
            block_size,
            True,
            spec.head_size,
            spec.head_size,
            False,
            b.window_left,
            -1,
            False,
            0,
            0,
        ]  # fa2: fixed_split_size, disable_split_kv, num_colocated_ctas, uniform_q_len
        info = w._cached_module.plan(*args)
        if [int(x) for x in info] != g.plan_info:
            raise _PlanChanged(
                f"FlashInfer re-plan of the batch-{n} CUDA graph changed its launch layout "
                f"({g.plan_info} at capture, {list(info)} now)"
            )
        w._plan_info = info
