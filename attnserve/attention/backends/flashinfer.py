"""FLASHINFER: FlashInfer's paged-KV prefill/decode kernels.

The builder plans FlashInfer's wrappers once per step (``plan()``: page index arrays, split-KV schedule) and each
layer's Impl (``flashinfer_impl.py``) only calls ``run()``. Decode-only steps use
``BatchDecodeWithPagedKVCacheWrapper`` (tensor cores when GQA groups query heads), prefill-only and mixed steps one
``BatchPrefillWithPagedKVCacheWrapper`` call; ``use_prefill_decode_attention`` splits a mixed step into a decode
and a prefill call; ``disable_flashinfer_prefill`` runs the prefill part on our Triton kernel. The cache is
``(num_blocks, 2, block_size, Hkv, D)`` in NHD or HND memory order. fp8 KV cache (e4m3 or e5m2): both wrappers are
planned with the cache's ``kv_data_type``. The decode keeps the model-dtype query (fa2 tensor cores over the fp8
cache: FlashInfer's fp8-query decode is 3.4x slower on the H200). The prefill's query is quantized to the cache's
fp8 type with the layer's static ``q_scale`` (1.0, the checkpoint's or calculate_kv_scales'), saturated, where the
GPU's prefill kernel takes it (sm90's) unless ``disable_flashinfer_q_quantization``
(:func:`flashinfer_modules.query_dtypes`); ``run()`` gets ``q_scale`` then, and ``k_scale``/``v_scale``.
FlashInfer's TRT-LLM kernels are not wired: ``use_trtllm_attention`` unset never uses them, ``true`` is refused.

Planning never synchronises with the device: plan() gets its host arrays (``indptr``, ``last_page_len``,
``seq_lens``) in pinned memory and the page ids as a device tensor built by a kernel from the device block
table (FlashInfer copies a host page-id tensor with a *blocking* copy, a full stream synchronisation). CUDA
graphs (pure decode): see :mod:`attnserve.attention.backends.flashinfer_graphs`.

Limits (FlashInfer docs and the kernels' dispatch tables, as vLLM declares them):
* GPUs: SM75 (Turing) through Blackwell: compute capability 7.5 to 12.1.
* head sizes 64, 128, 256 (``DISPATCH_HEAD_DIM`` in include/flashinfer/utils.cuh).
* page (block) sizes 16, 32, 64: the sizes the TRT-LLM-generated kernels on Blackwell accept; vLLM uses
  the same list on every GPU.
* fp8 KV cache (e4m3 and e5m2); dtypes float16 and bfloat16.
* sliding window and logits soft cap: yes. Attention sinks: no (FlashInfer has them through its TRT-LLM
  kernels, which are not wired here).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from attnserve.attention.backend import (
    AttentionBackend,
    AttentionLayerSpec,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
    CudaGraphSupport,
)
from attnserve.attention.backends import flashinfer_jit
from attnserve.attention.backends.flashinfer_modules import plan_settings, takes_fp8_query
from attnserve.kernels.kv_write import FP8_DTYPES
from attnserve.kernels.paged_kv_indices import device_pages, host_pages
from attnserve.attention.ops.pinned_ring import PinnedRing
from attnserve.refusals import Reason
from attnserve.refusals.backends import TRTLLM_NOT_WIRED, trtllm_needs_blackwell

if TYPE_CHECKING:  # flashinfer_graphs and flashinfer_impl import this module: imported where used
    from attnserve.attention.backends.flashinfer_graphs import FlashInferGraph
    from attnserve.attention.backends.flashinfer_impl import FlashInferImpl

logger = logging.getLogger(__name__)


@functools.cache
def _warn_once(message: str) -> None:
    logger.warning(message)


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
    supports_sinks = False  # FlashInfer's sinks come with its TRT-LLM kernels, not wired here
    supported_attn_types = (AttentionType.DECODER,)
    device_types = ("cuda",)
    required_package = "flashinfer"
    pip_extra = "flashinfer"
    required_kv_cache_layout = None
    cuda_graph_support = CudaGraphSupport.UNIFORM_SINGLE_TOKEN_DECODE

    @staticmethod
    def get_impl_cls() -> type["FlashInferImpl"]:
        from attnserve.attention.backends.flashinfer_impl import FlashInferImpl

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
    def compile_ahead(
        cls, layer_specs: list[AttentionLayerSpec], device: torch.device, dtype: torch.dtype, attention_config
    ) -> None:
        """The kernel modules these layers' wrappers will load, compiled in the background where missing
        (:mod:`flashinfer_jit`); never raises."""
        flashinfer_jit.start(layer_specs, device, dtype, attention_config)

    @classmethod
    def extra_reasons(cls, selector_config, platform, attention_config=None) -> list[Reason]:
        if attention_config is None or attention_config.use_trtllm_attention is not True:
            return []  # unset or false: the FlashInfer wrappers, on every GPU
        cc = platform.compute_capability
        if cc is None or cc[0] != 10:
            where = f"{cc[0]}.{cc[1]}" if cc else "unknown"
            return [trtllm_needs_blackwell(where)]
        return [TRTLLM_NOT_WIRED]


_WORKSPACE_BYTES = 256 << 20
_WORKSPACES: dict[str, torch.Tensor] = {}


def _workspace(device: torch.device) -> torch.Tensor:
    """FlashInfer's float workspace, one per device (shared by the wrappers of every builder)."""
    key = str(device)
    if key not in _WORKSPACES:
        _WORKSPACES[key] = torch.empty(_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    return _WORKSPACES[key]


@dataclass
class FlashInferCall:
    """One wrapper run over requests [first, last): ``decode`` (decode wrapper), ``prefill`` (prefill
    wrapper, any query lengths) or ``fallback`` (our Triton kernel, for disable_flashinfer_prefill)."""

    kind: str
    query_start: int
    query_end: int
    wrapper: Any = None
    tiles: tuple | None = None  # fallback only: (tile_seq, tile_start) for the Triton kernel
    q_dtype: torch.dtype | None = None  # the query type the wrapper was planned for (fp8: the Impl quantizes)


@dataclass
class FlashInferMetadata:
    slot_mapping: torch.Tensor  # (T,) int64
    calls: list[FlashInferCall]
    # for the fallback prefill kernel
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    graph: FlashInferGraph | None = None  # CUDA-graph metadata only


class FlashInferMetadataBuilder(AttentionMetadataBuilder):
    """plan() once per step (decode and/or prefill wrapper); each layer's impl only calls run().

    Host work per step, and no host-device synchronisation: ``indptr``/``last_page_len``/``seq_lens`` with
    numpy into pinned buffers (a rotating pair, see :class:`PinnedRing`), the page ids on the device
    (``device_pages``), plan(). CUDA-graph replays rebuild the page arrays inside the graph and re-plan only
    the batch sizes whose split-KV schedule depends on the context lengths (see
    ``flashinfer_graphs.FlashInferGraphPlanner.build_for_cudagraph_capture``).
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        import flashinfer

        from attnserve.attention.backends.flashinfer_graphs import FlashInferGraphPlanner

        cfg = self.attention_config
        self.prefill_decode = bool(cfg is not None and cfg.use_prefill_decode_attention)
        self.disable_prefill = bool(cfg is not None and cfg.disable_flashinfer_prefill)
        spec = self.layer_spec
        # dtypes, tensor cores, decode backend, window: shared with the kernels compiled ahead (flashinfer_modules)
        fp8_query = takes_fp8_query(self.device)
        settings = plan_settings(spec, self.dtype, cfg, fp8_query)
        self.kv_dtype = settings.kv_dtype
        self.decode_q_dtype = settings.decode_q_dtype  # the decode wrapper's query (the model's)
        self.prefill_q_dtype = settings.prefill_q_dtype  # the prefill's: the fp8 cache's where quantized
        if cfg is not None and cfg.disable_flashinfer_q_quantization:
            if self.kv_dtype not in FP8_DTYPES:
                _warn_once(
                    "disable_flashinfer_q_quantization has no effect with a 16-bit KV cache (kv_cache_dtype "
                    "auto): the query is quantized only for an fp8 cache"
                )
            elif not fp8_query:
                _warn_once(
                    "disable_flashinfer_q_quantization has no effect on this GPU: FlashInfer's kernels here take "
                    "a 16-bit query over the fp8 cache (only its sm90 prefill takes an fp8 one)"
                )
        layout = self.kv_cache_layout.value
        ws = _workspace(self.device)
        self.tensor_cores = settings.tensor_cores  # GQA (PlanSettings says why)
        self.decode_backend = settings.decode_backend  # "fa2"
        self.decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            ws, layout, use_tensor_cores=self.tensor_cores, backend=self.decode_backend
        )
        self.prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, layout)
        # sm90's fa3 prefill still compiling in the background (flashinfer_modules.first_use): fa2's until it loads
        self._later = flashinfer_jit.pending_prefill(settings, self.device)
        self.prefill_interim = None
        self.interim_plans = 0  # prefill plans made on the interim wrapper (flashinfer_first_use reports it)
        if self._later is not None:
            self.prefill_interim = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, layout, backend="fa2")
        self.window_left = settings.window_left
        self._compiled_ahead = False  # the first build waits for the background compile (flashinfer_jit.wait)
        # the CUDA-graph decode path: its buffers, pinned ring, split limit and fast-plan state
        self.graph_planner = FlashInferGraphPlanner(self)
        cuda = self.device.type == "cuda"
        self._rings = {"decode": PinnedRing(cuda), "prefill": PinnedRing(cuda)}
        if self.disable_prefill:
            from attnserve.kernels.triton_attention import block_m_for

            self.block_q = block_m_for(spec.num_heads // spec.num_kv_heads)[1]

    # ------------------------------------------------------------------------------------------ eager steps
    def _pages(self, common: CommonAttentionMetadata, first: int, last: int, ring: PinnedRing):
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
        device_pages(
            common.seq_lens[first:last], common.block_table[first:last], bs, scratch[: n + 1], scratch[n + 1 :], indices
        )
        return indptr, indices[:total], last_len, lens

    def _plan_decode(self, common: CommonAttentionMetadata, first: int, last: int) -> None:
        spec, ring = self.layer_spec, self._rings["decode"]
        ring.acquire()
        indptr, indices, last_len, lens = self._pages(common, first, last, ring)
        self.decode._pin_memory_int_workspace_buffer = ring.buffer(
            "plan", self.decode._int_workspace_buffer.numel(), torch.uint8
        )
        self.decode.plan(
            indptr,
            indices,
            last_len,
            spec.num_heads,
            spec.num_kv_heads,
            spec.head_size,
            common.block_size,
            window_left=self.window_left,
            logits_soft_cap=spec.logits_soft_cap,
            q_data_type=self.decode_q_dtype,
            kv_data_type=self.kv_dtype,
            o_data_type=self.dtype,
            sm_scale=spec.scale,
            seq_lens=lens,
        )
        ring.release()

    def _plan(self, kind: str, common: CommonAttentionMetadata, first: int, last: int) -> FlashInferCall:
        spec = self.layer_spec
        qsl = common.query_start_loc_cpu
        q0, q1 = int(qsl[first]), int(qsl[last])
        if kind == "fallback":
            from attnserve.kernels.triton_attention import query_tiles

            seq, start = query_tiles(qsl, self.block_q, first, last)
            return FlashInferCall(kind, q0, q1, tiles=(seq.to(self.device), start.to(self.device)))
        if kind == "decode":
            self._plan_decode(common, first, last)
            return FlashInferCall(kind, q0, q1, self.decode, q_dtype=self.decode_q_dtype)
        wrapper, q_dtype = self._prefill_wrapper()
        ring = self._rings["prefill"]
        ring.acquire()
        indptr, indices, last_len, lens = self._pages(common, first, last, ring)
        qo = ring.buffer("qo", last - first + 1)
        torch.sub(qsl[first : last + 1], q0, out=qo)
        wrapper._pin_memory_int_workspace_buffer = ring.buffer(
            "plan", wrapper._int_workspace_buffer.numel(), torch.uint8
        )
        wrapper.plan(
            qo,
            indptr,
            indices,
            last_len,
            spec.num_heads,
            spec.num_kv_heads,
            spec.head_size,
            common.block_size,
            causal=True,
            sm_scale=spec.scale,
            window_left=self.window_left,
            logits_soft_cap=spec.logits_soft_cap,
            q_data_type=q_dtype,
            kv_data_type=self.kv_dtype,
            o_data_type=self.dtype,
            seq_lens=lens,
        )
        ring.release()
        return FlashInferCall(kind, q0, q1, wrapper, q_dtype=q_dtype)

    def _prefill_wrapper(self) -> tuple[Any, torch.dtype]:
        """The prefill wrapper to plan and its query type: the interim fa2 one, with the model-dtype query, while
        the prefill's own module compiles in the background (or after that failed), then the prefill's own."""
        if self._later is not None:
            if not self._later.ready():
                self.interim_plans += 1
                return self.prefill_interim, self.dtype
            self._later = self.prefill_interim = None
        return self.prefill, self.prefill_q_dtype

    def _wait_for_kernels(self) -> None:
        """Before the first plan(): the kernels this process compiles ahead (flashinfer_jit), if any."""
        if not self._compiled_ahead:
            self._compiled_ahead = True
            flashinfer_jit.wait()

    def build(self, common: CommonAttentionMetadata) -> FlashInferMetadata:
        self._wait_for_kernels()
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
        return FlashInferMetadata(
            common.slot_mapping, calls, common.query_start_loc, common.seq_lens, common.block_table
        )

    # ------------------------------------------------------------------------------------------ CUDA graphs
    # flashinfer_graphs.FlashInferGraphPlanner plans them; the hooks the model runner calls delegate to it
    def build_for_cudagraph_capture(self, common: CommonAttentionMetadata) -> FlashInferMetadata:
        self._wait_for_kernels()
        return self.graph_planner.build_for_cudagraph_capture(common)

    def cudagraph_prologue(self, metadata: FlashInferMetadata) -> None:
        self.graph_planner.cudagraph_prologue(metadata)

    def prepare_cudagraph_replay(self, metadata: FlashInferMetadata, common: CommonAttentionMetadata) -> None:
        self.graph_planner.prepare_cudagraph_replay(metadata, common)

    @property
    def split_limit(self) -> int:
        """FlashInfer's split limit in requests (see ``flashinfer_graphs._PLANNER_CTAS_PER_SM``)."""
        return self.graph_planner.split_limit

    @split_limit.setter
    def split_limit(self, value: int) -> None:
        self.graph_planner.split_limit = value

    @property
    def fast_plan_error(self) -> str | None:
        """Why CUDA-graph replays fell back to plan(), if they did."""
        return self.graph_planner.fast_plan_error

    @fast_plan_error.setter
    def fast_plan_error(self, value: str | None) -> None:
        self.graph_planner.fast_plan_error = value
