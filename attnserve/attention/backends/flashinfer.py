"""FLASHINFER: FlashInfer's paged-KV prefill/decode kernels.

The builder plans FlashInfer's wrappers once per step (``plan()``: page index arrays, split-KV schedule)
and each layer only calls ``run()``. Decode-only steps use ``BatchDecodeWithPagedKVCacheWrapper`` (tensor
cores when GQA groups query heads), prefill-only and mixed steps one ``BatchPrefillWithPagedKVCacheWrapper``
call; ``use_prefill_decode_attention`` splits a mixed step into a decode and a prefill call;
``disable_flashinfer_prefill`` runs the prefill part on our Triton kernel. The cache is
``(num_blocks, 2, block_size, Hkv, D)`` in NHD or HND memory order. fp8 KV cache: per-tensor scales;
the prefill wrapper's query is quantized to fp8 too unless ``disable_flashinfer_q_quantization``.
``use_trtllm_attention=True`` off CC 10.x is an error; the TRT-LLM path itself is not wired yet.

Planning never synchronises with the device: plan() gets its host arrays (``indptr``, ``last_page_len``,
``seq_lens``) in pinned memory and the page ids as a device tensor built by a kernel from the device block
table (FlashInfer copies a host page-id tensor with a *blocking* copy, a full stream synchronisation). CUDA
graphs (pure decode): one ``use_cuda_graph`` wrapper per batch size whose graph rebuilds the page arrays
itself (``cudagraph_prologue``); replays re-plan only where the split-KV schedule depends on the context
lengths (see ``FlashInferMetadataBuilder.build_for_cudagraph_capture``).

Limits (FlashInfer docs and the kernels' dispatch tables, as vLLM declares them):
* GPUs: SM75 (Turing) through Blackwell: compute capability 7.5 to 12.1.
* head sizes 64, 128, 256 (``DISPATCH_HEAD_DIM`` in include/flashinfer/utils.cuh).
* page (block) sizes 16, 32, 64: the sizes the TRT-LLM-generated kernels on Blackwell accept; vLLM uses
  the same list on every GPU.
* fp8 KV cache (e4m3 and e5m2); dtypes float16 and bfloat16.
* sliding window and logits soft cap: yes. Attention sinks: only through the TRT-LLM kernels (CC 10.x).
* On CC 10.x the TRT-LLM kernels need the HND layout, so the backend requires it there.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from attnserve.attention.backend import (
    AttentionBackend,
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
    CudaGraphSupport,
    KVCacheLayout,
)
from attnserve.attention.ops.kv_write import kv_views, write_kv
from attnserve.attention.ops.paged_kv_indices import device_pages, host_pages
from attnserve.attention.capabilities import BackendCapabilities

logger = logging.getLogger(__name__)


def _trtllm_applies(platform, attention_config) -> bool:
    """TRT-LLM kernels run on CC 10.x unless the user turned them off (use_trtllm_attention=False)."""
    on_blackwell = platform is not None and platform.compute_capability is not None \
        and platform.compute_capability[0] == 10
    flag = attention_config.use_trtllm_attention if attention_config is not None else None
    return on_blackwell and flag is not False


class FlashInferBackend(AttentionBackend):
    name: ClassVar[str] = "FLASHINFER"
    supported_dtypes = (torch.float16, torch.bfloat16)
    supported_kv_cache_dtypes = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
    supported_head_sizes = (64, 128, 256)
    supported_block_sizes = (16, 32, 64)
    min_compute_capability = (7, 5)
    max_compute_capability = (12, 1)
    supports_sliding_window = True
    supports_logits_soft_cap = True
    supports_sinks = True  # TRT-LLM kernels only (CC 10.x); see capabilities()
    supported_attn_types = (AttentionType.DECODER,)
    device_types = ("cuda",)
    required_package = "flashinfer"
    pip_extra = "flashinfer"
    required_kv_cache_layout = None  # HND on CC 10.x; see get_required_kv_cache_layout()
    cuda_graph_support = CudaGraphSupport.UNIFORM_SINGLE_TOKEN_DECODE

    @staticmethod
    def get_impl_cls() -> type["FlashInferImpl"]:
        return FlashInferImpl

    @staticmethod
    def get_builder_cls() -> type["FlashInferMetadataBuilder"]:
        return FlashInferMetadataBuilder

    @classmethod
    def get_kv_cache_shape(cls, num_blocks: int, block_size: int, num_kv_heads: int, head_size: int) -> tuple[int, ...]:
        """``(num_blocks, 2, block_size, num_kv_heads, head_size)``: K and V of a block sit together, as
        FlashInfer's paged-KV wrappers take them."""
        return (num_blocks, 2, block_size, num_kv_heads, head_size)

    @classmethod
    def capabilities(cls, platform=None, attention_config=None, assume_installed=False) -> BackendCapabilities:
        if platform is None:
            return BackendCapabilities.from_backend(cls)
        trtllm = _trtllm_applies(platform, attention_config)
        return BackendCapabilities.from_backend(
            cls, sinks=trtllm, required_kv_cache_layout=KVCacheLayout.HND if trtllm else None,
            cuda_graph_support=CudaGraphSupport.UNIFORM_BATCH if trtllm else cls.cuda_graph_support,
        )

    @classmethod
    def extra_reasons(cls, selector_config, platform, attention_config=None) -> list[str]:
        reasons = []
        cc = platform.compute_capability
        if attention_config is not None and attention_config.use_trtllm_attention is True and \
                (cc is None or cc[0] != 10):
            where = f"{cc[0]}.{cc[1]}" if cc else "unknown"
            reasons.append(f"use_trtllm_attention=True needs compute capability 10.x (this device: {where})")
        if selector_config.has_sink and not _trtllm_applies(platform, attention_config):
            # replace the generic "attention sinks not supported" with the way to get them
            reasons.append("attention sinks need FlashInfer's TRT-LLM kernels (compute capability 10.x)")
        return reasons

    @classmethod
    def validate(cls, selector_config, platform, attention_config=None, assume_installed=False) -> list[str]:
        reasons = super().validate(selector_config, platform, attention_config, assume_installed)
        return [r for r in reasons if r != "attention sinks not supported"]

    @classmethod
    def get_required_kv_cache_layout(cls, platform=None, attention_config=None) -> KVCacheLayout | None:
        return KVCacheLayout.HND if _trtllm_applies(platform, attention_config) else None


_WORKSPACE_BYTES = 256 << 20
_WORKSPACES: dict[str, torch.Tensor] = {}


def _workspace(device: torch.device) -> torch.Tensor:
    """FlashInfer's float workspace, one per device (shared by the wrappers of every builder)."""
    key = str(device)
    if key not in _WORKSPACES:
        _WORKSPACES[key] = torch.empty(_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    return _WORKSPACES[key]


def _kv_torch_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    return {"auto": model_dtype, "fp8_e5m2": torch.float8_e5m2}.get(kv_cache_dtype, torch.float8_e4m3fn)


@dataclass
class FlashInferCall:
    """One wrapper run over requests [first, last): ``decode`` (decode wrapper), ``prefill`` (prefill
    wrapper, any query lengths) or ``fallback`` (our Triton kernel, for disable_flashinfer_prefill)."""

    kind: str
    query_start: int
    query_end: int
    wrapper: Any = None
    tiles: tuple | None = None  # fallback only: (tile_seq, tile_start) for the Triton kernel


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


@dataclass
class FlashInferMetadata:
    slot_mapping: torch.Tensor  # (T,) int64
    calls: list[FlashInferCall]
    # for the fallback prefill kernel
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    graph: FlashInferGraph | None = None  # CUDA-graph metadata only


class _PlanChanged(RuntimeError):
    """A replay's plan differs from the captured one in what the graph's kernels were launched with."""


# FlashInfer's batch-prefill planner (the tensor-core decode's) budgets 2 CTAs per SM
# (PrefillPlanImpl in include/flashinfer/attention/scheduler.cuh: num_blocks_per_sm = 2) and splits a
# request's KV only while batch_size * num_kv_heads leaves SMs idle: past max_batch_size_if_split =
# 2 * num_SMs // num_kv_heads requests every request is one chunk whatever its length.
_PLANNER_CTAS_PER_SM = 2


class _PinnedRing:
    """Pinned host buffers that asynchronous host-to-device copies read, in rotating sets.

    ``acquire()`` takes the next set, waiting (rarely) until the copies enqueued from it last time have run:
    a host that prepares step k+1 while the device still runs step k must not overwrite data a pending copy
    of step k has yet to read (FlashInfer's own planner reuses one pinned buffer per wrapper, which is safe
    only when every step ends with a host synchronisation). ``release()`` marks the end of a set's copies.
    """

    def __init__(self, cuda: bool = True, slots: int = 2) -> None:
        self.cuda = cuda  # False: plain host memory, no events (device-less tests)
        self._sets: list[dict[str, torch.Tensor]] = [{} for _ in range(slots)]
        self._events: list[Any] = [None] * slots
        self._retired: list[torch.Tensor] = []  # outgrown buffers a pending copy may still read
        self._next = 0
        self._cur = 0

    def acquire(self) -> None:
        self._cur, self._next = self._next, (self._next + 1) % len(self._sets)
        event = self._events[self._cur]
        if event is not None and not event.query():
            event.synchronize()  # the device is more than one step behind: wait for that set's copies only

    def buffer(self, name: str, numel: int, dtype: torch.dtype = torch.int32) -> torch.Tensor:
        """The current set's pinned buffer ``name``, its first ``numel`` entries."""
        bufs = self._sets[self._cur]
        buf = bufs.get(name)
        if buf is None or buf.numel() < numel or buf.dtype != dtype:
            size = max(numel, 256)
            if buf is not None:
                self._retired.append(buf)
                size = max(size, 2 * buf.numel())  # grow geometrically: few retired buffers
            buf = torch.empty(size, dtype=dtype, pin_memory=self.cuda)
            bufs[name] = buf
        return buf[:numel]

    def reserve(self, name: str, numel: int, dtype: torch.dtype = torch.int32) -> None:
        """Allocate ``name`` in every set now (pinned allocations are slow: not in a replay)."""
        cur = self._cur
        for i in range(len(self._sets)):
            self._cur = i
            self.buffer(name, numel, dtype)
        self._cur = cur

    def release(self) -> None:
        if not self.cuda:
            return
        event = self._events[self._cur]
        if event is None:
            event = self._events[self._cur] = torch.cuda.Event()
        event.record()


class FlashInferMetadataBuilder(AttentionMetadataBuilder):
    """plan() once per step (decode and/or prefill wrapper); each layer's impl only calls run().

    Host work per step, and no host-device synchronisation: ``indptr``/``last_page_len``/``seq_lens`` with
    numpy into pinned buffers (a rotating pair, see :class:`_PinnedRing`), the page ids on the device
    (``device_pages``), plan(). CUDA-graph replays rebuild the page arrays inside the graph and re-plan only
    the batch sizes whose split-KV schedule depends on the context lengths (see :meth:`build_for_cudagraph_capture`).
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        import flashinfer

        cfg = self.attention_config
        self.prefill_decode = bool(cfg is not None and cfg.use_prefill_decode_attention)
        self.disable_prefill = bool(cfg is not None and cfg.disable_flashinfer_prefill)
        self.quantize_q = not (cfg is not None and cfg.disable_flashinfer_q_quantization)
        cc = torch.cuda.get_device_capability(self.device)
        flag = cfg.use_trtllm_attention if cfg is not None else None
        if flag is True and cc[0] != 10:
            raise ValueError(f"use_trtllm_attention=True needs compute capability 10.x (this device: {cc[0]}.{cc[1]}); "
                             "FlashInfer's TRT-LLM kernels exist for Blackwell only")
        self.trtllm = cc[0] == 10 and flag is not False
        spec = self.layer_spec
        self.kv_dtype = _kv_torch_dtype(spec.kv_cache_dtype, self.dtype)
        layout = self.kv_cache_layout.value
        ws = _workspace(self.device)
        # tensor-core decode for GQA: the grouped query heads of a KV head form the MMA's rows
        self.tensor_cores = spec.num_heads != spec.num_kv_heads
        # "fa2" is what "auto" resolves to for 16-bit KV; naming it skips auto's per-plan cuDNN probe
        # (two `import cudnn` attempts per eager plan() where cudnn-frontend is not installed)
        self.decode_backend = "fa2" if self.kv_dtype == self.dtype else "auto"
        self.decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            ws, layout, use_tensor_cores=self.tensor_cores, backend=self.decode_backend)
        self.prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, layout)
        self.window_left = spec.sliding_window - 1 if spec.sliding_window else -1
        sms = torch.cuda.get_device_properties(self.device).multi_processor_count
        self.split_limit = _PLANNER_CTAS_PER_SM * sms // spec.num_kv_heads
        cuda = self.device.type == "cuda"
        self._rings = {"decode": _PinnedRing(cuda), "prefill": _PinnedRing(cuda), "graph": _PinnedRing(cuda)}
        self._graph_bufs: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self.fast_plan_error: str | None = None  # why replays fell back to plan(), if they did
        if self.disable_prefill:
            from attnserve.attention.ops.triton_attention import block_m_for

            self.block_q = block_m_for(spec.num_heads // spec.num_kv_heads)[1]

    # ------------------------------------------------------------------------------------------ eager steps
    def _pages(self, common: CommonAttentionMetadata, first: int, last: int, ring: _PinnedRing):
        """FlashInfer's page arguments for requests [first, last): ``indptr``, ``last_page_len`` and
        ``seq_lens`` in pinned host memory (plan() reads them and copies them without blocking), the page
        ids built on the device from the device block table. No host-device synchronisation."""
        n, bs = last - first, common.block_size
        indptr, last_len, lens = ring.buffer("indptr", n + 1), ring.buffer("last", n), ring.buffer("lens", n)
        lens.copy_(common.seq_lens_cpu[first:last])
        indptr_np, _ = host_pages(lens.numpy(), bs, indptr.numpy(), last_len.numpy())
        total = int(indptr_np[n])
        indices = torch.empty(total + 1, dtype=torch.int32, device=self.device)
        scratch = torch.empty(2 * n + 1, dtype=torch.int32, device=self.device)  # device indptr/last, unused
        device_pages(common.seq_lens[first:last], common.block_table[first:last], bs, scratch[: n + 1],
                     scratch[n + 1:], indices)
        return indptr, indices[:total], last_len, lens

    def _plan_decode(self, common: CommonAttentionMetadata, first: int, last: int) -> None:
        spec, ring = self.layer_spec, self._rings["decode"]
        ring.acquire()
        indptr, indices, last_len, lens = self._pages(common, first, last, ring)
        self.decode._pin_memory_int_workspace_buffer = ring.buffer(
            "plan", self.decode._int_workspace_buffer.numel(), torch.uint8)
        self.decode.plan(indptr, indices, last_len, spec.num_heads, spec.num_kv_heads, spec.head_size,
                         common.block_size, window_left=self.window_left, logits_soft_cap=spec.logits_soft_cap,
                         q_data_type=self.dtype, kv_data_type=self.kv_dtype, sm_scale=spec.scale, seq_lens=lens)
        ring.release()

    def _plan(self, kind: str, common: CommonAttentionMetadata, first: int, last: int) -> FlashInferCall:
        spec = self.layer_spec
        qsl = common.query_start_loc_cpu
        q0, q1 = int(qsl[first]), int(qsl[last])
        if kind == "fallback":
            from attnserve.attention.ops.triton_attention import query_tiles

            seq, start = query_tiles(qsl, self.block_q, first, last)
            return FlashInferCall(kind, q0, q1, tiles=(seq.to(self.device), start.to(self.device)))
        if kind == "decode":
            self._plan_decode(common, first, last)
            return FlashInferCall(kind, q0, q1, self.decode)
        ring = self._rings["prefill"]
        ring.acquire()
        indptr, indices, last_len, lens = self._pages(common, first, last, ring)
        qo = ring.buffer("qo", last - first + 1)
        torch.sub(qsl[first:last + 1], q0, out=qo)
        fp8 = self.kv_dtype != self.dtype
        q_dtype = self.kv_dtype if fp8 and self.quantize_q else self.dtype
        self.prefill._pin_memory_int_workspace_buffer = ring.buffer(
            "plan", self.prefill._int_workspace_buffer.numel(), torch.uint8)
        self.prefill.plan(qo, indptr, indices, last_len, spec.num_heads, spec.num_kv_heads, spec.head_size,
                          common.block_size, causal=True, sm_scale=spec.scale, window_left=self.window_left,
                          logits_soft_cap=spec.logits_soft_cap, q_data_type=q_dtype, kv_data_type=self.kv_dtype,
                          o_data_type=self.dtype, seq_lens=lens)
        ring.release()
        return FlashInferCall(kind, q0, q1, self.prefill)

    def build(self, common: CommonAttentionMetadata) -> FlashInferMetadata:
        if self.trtllm:  # pragma: no cover - Blackwell only; not reachable on the H200
            raise NotImplementedError("FlashInfer TRT-LLM kernels (compute capability 10.x) are not wired yet")
        nd, b = common.num_decodes, common.num_reqs
        prefill_kind = "fallback" if self.disable_prefill else "prefill"
        if nd == b:
            calls = [self._plan("decode", common, 0, b)]
        elif nd == 0:
            calls = [self._plan(prefill_kind, common, 0, b)]
        elif self.prefill_decode or self.disable_prefill:
            calls = [self._plan("decode", common, 0, nd), self._plan(prefill_kind, common, nd, b)]
        else:  # one prefill-kernel call over the mixed batch (decodes are prefills of length 1)
            calls = [self._plan("prefill", common, 0, b)]
        return FlashInferMetadata(common.slot_mapping, calls, common.query_start_loc, common.seq_lens,
                                  common.block_table)

    # ------------------------------------------------------------------------------------------ CUDA graphs
    def build_for_cudagraph_capture(self, common: CommonAttentionMetadata) -> FlashInferMetadata:
        """A CUDA-graph decode wrapper for this batch size (FlashInfer's ``use_cuda_graph=True``: fixed
        batch size, page arrays in fixed buffers), planned once here.

        The page arrays are rebuilt at the head of every replay from the runner's static buffers
        (:meth:`cudagraph_prologue`). Whether a replay re-plans depends on the batch size: above FlashInfer's
        split limit (``2 * SMs // num_kv_heads`` requests, 33 for 8 KV heads on an H200) its planner never
        splits a request's KV, so the tensor-core wrapper is planned with ``disable_split_kv=True``: the
        same one-chunk-per-request work, no merge kernel, and a schedule that does not depend on the context
        lengths: replays plan nothing. At or below the limit the split count follows the longest context,
        and each replay re-plans (the C++ planner directly, :meth:`_fast_plan`). The buffers are shared by
        every batch size's wrapper: only one graph runs at a time.
        """
        import flashinfer

        spec, bs = self.layer_spec, common.num_reqs
        need = bs * common.block_table.shape[1] + 1  # + the device builder's scratch entry
        if self._graph_bufs is None or self._graph_bufs[2].numel() < need or self._graph_bufs[0].numel() < bs + 1:
            # the first (largest) capture sizes them
            self._graph_bufs = (torch.zeros(bs + 1, dtype=torch.int32, device=self.device),
                                torch.ones(bs, dtype=torch.int32, device=self.device),
                                torch.zeros(need, dtype=torch.int32, device=self.device))
        indptr, last_len, indices = self._graph_bufs[0][: bs + 1], self._graph_bufs[1][:bs], self._graph_bufs[2][:need]
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            _workspace(self.device), self.kv_cache_layout.value, use_cuda_graph=True,
            use_tensor_cores=self.tensor_cores, backend=self.decode_backend, paged_kv_indptr_buffer=indptr,
            paged_kv_indices_buffer=indices, paged_kv_last_page_len_buffer=last_len)
        split = bs <= self.split_limit
        g = FlashInferGraph(wrapper, bs, common.block_size, common.seq_lens, common.block_table, indptr, last_len,
                            indices, "plan")
        self.cudagraph_prologue(FlashInferMetadata(common.slot_mapping, [], common.query_start_loc,
                                                   common.seq_lens, common.block_table, g))
        host_indptr, host_last = host_pages(common.seq_lens_cpu.numpy(), common.block_size)
        extra = dict(disable_split_kv=not split) if self.tensor_cores else {}
        wrapper.plan(torch.from_numpy(host_indptr), indices[: int(host_indptr[-1])], torch.from_numpy(host_last),
                     spec.num_heads, spec.num_kv_heads, spec.head_size, common.block_size,
                     window_left=self.window_left, logits_soft_cap=spec.logits_soft_cap, q_data_type=self.dtype,
                     kv_data_type=self.kv_dtype, sm_scale=spec.scale, seq_lens=common.seq_lens_cpu, **extra)
        try:  # the launch layout the graph's kernels get (FlashInfer's PrefillPlanInfo as a list)
            g.plan_info = [int(x) for x in wrapper._plan_info]
        except Exception:  # noqa: BLE001 - none, or not a list of ints: no fast re-plan
            g.plan_info = None
        fa2 = self.tensor_cores and getattr(wrapper, "_backend", None) == "fa2" \
            and getattr(wrapper, "_jit_module", None) is None and g.plan_info is not None
        if fa2 and not split:
            g.replan = "none"
        elif fa2 and self.fast_plan_error is None:
            g.replan = "fast"
            g.qo_indptr = torch.arange(bs + 1, dtype=torch.int32)
        if g.replan != "none":
            ring = self._rings["graph"]
            ring.reserve("plan", wrapper._int_workspace_buffer.numel(), torch.uint8)
            ring.reserve("indptr", bs + 1)
            ring.reserve("last", bs)
        return FlashInferMetadata(common.slot_mapping, [FlashInferCall("decode", 0, bs, wrapper)],
                                  common.query_start_loc, common.seq_lens, common.block_table, g)

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
        ring = self._rings["graph"]
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
                logger.warning("FlashInfer fast re-plan failed (%s); CUDA-graph replays call plan()",
                               self.fast_plan_error)
                g.replan = "plan"
        if g.replan == "plan":
            spec = self.layer_spec
            g.wrapper._pin_memory_int_workspace_buffer = pinned
            # the indices argument is the wrapper's own buffer (the prologue fills it): plan() copies nothing
            g.wrapper.plan(indptr, g.indices[: int(indptr[n])], last_len, spec.num_heads, spec.num_kv_heads,
                           spec.head_size, common.block_size, window_left=self.window_left,
                           logits_soft_cap=spec.logits_soft_cap, q_data_type=self.dtype,
                           kv_data_type=self.kv_dtype, sm_scale=spec.scale, seq_lens=common.seq_lens_cpu,
                           **(dict(disable_split_kv=False) if self.tensor_cores else {}))
        ring.release()

    def _fast_plan(self, g: FlashInferGraph, indptr: torch.Tensor, seq_lens: torch.Tensor, block_size: int,
                   pinned: torch.Tensor) -> None:
        """The tensor-core decode wrapper's plan() reduced to its C++ planner call (FlashInfer 0.7.2,
        ``BatchDecodeWithPagedKVCacheWrapper._plan_impl``'s tensor-core branch; as vLLM's
        ``fast_plan_decode``): the arguments the captured graph was planned with but the context
        lengths. The page buffers need no copy (the graph's prologue fills them). The planner writes the
        schedule into ``pinned`` and copies it to the wrapper's int workspace without blocking."""
        spec, w, n = self.layer_spec, g.wrapper, g.batch_size
        args = [w._float_workspace_buffer, w._int_workspace_buffer, pinned, g.qo_indptr, indptr, seq_lens,
                n, n, spec.num_heads, spec.num_kv_heads, block_size, True, spec.head_size, spec.head_size,
                False, self.window_left,
                -1, False, 0, 0]  # fa2: fixed_split_size, disable_split_kv, num_colocated_ctas, uniform_q_len
        info = w._cached_module.plan(*args)
        if [int(x) for x in info] != g.plan_info:
            raise _PlanChanged(f"FlashInfer re-plan of the batch-{n} CUDA graph changed its launch layout "
                               f"({g.plan_info} at capture, {list(info)} now)")
        w._plan_info = info


class FlashInferImpl(AttentionImpl):
    """Writes K/V (Triton kernel), then run() of each planned wrapper on its slice of the queries."""

    kv_dim = 1  # cache shape (num_blocks, 2, block_size, Hkv, D)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        cfg = self.attention_config
        self.quantize_q = not (cfg is not None and cfg.disable_flashinfer_q_quantization)
        self.k_scale = 1.0  # per-tensor fp8 scales: stored value = x / scale
        self.v_scale = 1.0

    def forward(self, query, key, value, kv_cache, metadata: FlashInferMetadata) -> torch.Tensor:
        self.last_q_scales = []  # (first, end, scale) of each fp8-quantized query slice, for tests
        key_cache, value_cache = kv_views(kv_cache, self.kv_dim)
        write_kv(key, value, key_cache, value_cache, metadata.slot_mapping, self.k_scale, self.v_scale)
        # FlashInfer takes the cache in its physical order: (N, 2, B, H, D) for NHD, (N, 2, H, B, D) for HND
        physical = kv_cache if kv_cache.is_contiguous() else kv_cache.transpose(2, 3)
        assert physical.is_contiguous(), "KV cache must be NHD or HND ordered"
        fp8 = kv_cache.dtype != query.dtype
        out = torch.empty_like(query)
        for call in metadata.calls:
            q = query[call.query_start:call.query_end]
            if call.kind == "fallback":
                from attnserve.attention.ops.triton_attention import paged_attention

                paged_attention(out, query, key_cache, value_cache, metadata.block_table, metadata.seq_lens,
                                metadata.query_start_loc, *call.tiles, self.scale,
                                sliding_window=self.sliding_window, logits_soft_cap=self.logits_soft_cap,
                                k_scale=self.k_scale, v_scale=self.v_scale)
                continue
            scales = dict(k_scale=self.k_scale, v_scale=self.v_scale) if fp8 else {}
            if fp8 and self.quantize_q and call.kind == "prefill":
                q_scale = (q.abs().amax().float() / torch.finfo(kv_cache.dtype).max).clamp_min(1e-12)
                q = (q.float() / q_scale).to(kv_cache.dtype)
                scales["q_scale"] = float(q_scale)
                self.last_q_scales.append((call.query_start, call.query_end, q_scale))
            call.wrapper.run(q, physical, out=out[call.query_start:call.query_end], **scales)
        return out
