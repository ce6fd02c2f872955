"""ModelRunner: SchedulerOutput -> ForwardBatch -> model -> logits -> Sampler -> sampled tokens.

Owns the model, the KV cache tensors, the attention backend's metadata builder (one per layer group when the
model's layers differ in window, soft cap or head size: ``attention_selection.py``), the captured CUDA graphs
of decode steps (``cuda_graph.py``; on CUDA unless ``enforce_eager`` or the backend declares no support) and
the per-request sampling state (``sampling_batch.SamplingState``: random generators, the last step's sampled
tokens). Holds no request state beyond that and the logits processors' device token counts
(``logits_processors.py``: penalties): every step's inputs come in the SchedulerOutput. The
logits of a step whose requests change them (penalties, bias, masks) pass through the processors, in one call
before sampling; the fused greedy head (``greedy_head.py``) runs only for steps without such requests.

Under tensor parallelism one ModelRunner runs in each worker process with its rank's ``tp``: it builds its
shard of the model, a KV cache for its KV heads, and runs the same forward pass as the others (the layers'
collectives meet in lockstep); only rank 0 samples. With async scheduling a step's placeholder tokens are
the last step's samples: the first step that needs them broadcasts them from rank 0 (``placeholders.py``).

A step's records and its sampling stage: ``step_output.py``; the layers and their attention Impls:
``model_build.py``; the activation memory kept free of KV cache: ``memory_profile.py``; the mixed steps run at
start-up on CUDA: ``warmup.py``; each layer's fp8 KV-cache scales: ``kv_scales.apply_kv_scales``.
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import torch

from attnserve.attention.backend import CudaGraphSupport
from attnserve.config.engine import EngineConfig
from attnserve.core.step import SchedulerOutput
from attnserve.distributed.group import SINGLE, TPGroup
from attnserve.distributed.sharding import shard_heads
from attnserve.gemv.enable import resolve_skinny_gemm, triton_installed, warn_if_ignored
from attnserve.model_executor.cuda_graph import CudaGraphRunner, capture_sizes
from attnserve.attention.forward_batch import ForwardBatch
from attnserve.model_executor.block_tables import BlockTableRows
from attnserve.model_executor.forward_batch import HostBatch, PinnedStaging, device_batch, host_batch
from attnserve.model_executor.gguf_cache import cache_root
from attnserve.model_executor.greedy_head import GreedyHead
from attnserve.model_executor.grouped_builder import GroupedMetadataBuilder
from attnserve.model_executor.kv_cache import allocate_kv_caches, bytes_per_block, kv_cache_torch_dtype, num_kv_blocks
from attnserve.model_executor.attention_selection import select_model_attention
from attnserve.model_executor.compile_ahead import compile_attention_kernels_ahead
from attnserve.model_executor.kv_scales import KVScales, apply_kv_scales
from attnserve.model_executor.memory_profile import activation_reserve_bytes
from attnserve.model_executor.model_build import build_model
from attnserve.model_executor.loader import ModelSource, load_weights, max_model_len_of
from attnserve.model_executor.warmup import warm_up_mixed_steps
from attnserve.model_executor.logits_processors import LogitsProcessors
from attnserve.model_executor.placeholders import placeholder_fill
from attnserve.model_executor.prompt_logprobs import PromptLogprobsPlan
from attnserve.model_executor.sampler import Sampler
from attnserve.model_executor.sampling_batch import SamplingState
from attnserve.model_executor.step_output import ModelRunnerOutput, PendingStep, QueuedForward
from attnserve.models.registry import get_model_class
from attnserve.platforms import detect_platform, runtime_device

logger = logging.getLogger(__name__)


class ModelRunner:
    """Runs the model for one step at a time on one device."""

    def __init__(self, config: EngineConfig, hf_config, source: ModelSource, tp: TPGroup = SINGLE) -> None:
        self.config = config
        self.hf_config = hf_config
        self.tp = tp
        self.platform = detect_platform(config.device)
        self.device = runtime_device(config.device)  # cuda:N, with its index: the KV-cache lines name the GPU
        # LLMEngine makes this same call before it loads anything (attention_selection.py): in its process this
        # one is answered from the selector's cache; a tensor-parallel worker judges again on its own device
        self.attention = select_model_attention(config, hf_config, tp.size)
        groups = self.attention.groups
        self.selector_config, self.attn_selection = groups[0].selector_config, groups[0].selection  # the first group's
        self.dtype = self.selector_config.dtype  # resolve_dtype's, on this platform
        self.block_size = config.cache.block_size
        model_cls = get_model_class(hf_config, tp.size)
        self.dims = model_cls.dims(hf_config)
        self.head_size = self.dims.head_size
        heads = shard_heads(self.dims.num_heads, self.dims.num_kv_heads, tp.size, tp.rank)
        self.num_kv_heads = heads.num_kv_heads  # this rank's: its KV cache holds only these
        # JIT kernels (FLASHINFER) compile in the background while the layers are built and the weights load
        compile_attention_kernels_ahead(config, self.attention, heads.num_heads, heads.num_kv_heads, self.device)
        self.num_layers = self.dims.num_layers
        self.kv_dtype = kv_cache_torch_dtype(config.cache.kv_cache_dtype, self.dtype)
        names = tp.all_gather_object(self.attention.backend_names)
        assert len(set(names)) == 1, f"ranks selected different attention backends: {names}"
        self.backend = self.attn_selection.backend_cls  # the first group's (every group's when there is one)
        # backends read their options (FA version as selected, FlashInfer flags) from the attention config
        self.attn_config = self._attention_config(self.attn_selection)
        group_configs = [self._attention_config(g.selection) for g in groups]
        if len(groups) > 1 and tp.is_driver:
            logger.info("Attention layer groups: %s", self.attention.describe())
        built = build_model(
            model_cls,
            hf_config,
            self.attention,
            group_configs,
            config.cache.kv_cache_dtype,
            self.device,
            self.dtype,
            tp,
        )
        self.model, self.layer_specs, self.attn_impls = built.model, built.layer_specs, built.attn_impls
        checkpoint_scales = KVScales()
        load_weights(
            self.model,
            source,
            config.model.load_format,
            hf_config,
            config.model.seed,
            sharded=tp.size > 1,
            kv_scales=checkpoint_scales,
        )
        self.kv_scales_source = apply_kv_scales(self, checkpoint_scales)
        self.model.eval()

        self.builders = [
            g.selection.backend_cls.get_builder_cls()(
                built.group_specs[g.index],
                self.device,
                self.dtype,
                attention_config=group_configs[g.index],
                kv_cache_layout=g.selection.kv_cache_layout,
            )
            for g in groups
        ]
        self.builder = self.builders[0] if len(groups) == 1 else GroupedMetadataBuilder(self.builders)
        self.sampler = Sampler()
        self.logits_processors = LogitsProcessors(self.device)  # rank 0's: penalties' token counts, masks, bias
        self.staging = PinnedStaging(self.device)
        self.block_table_rows = BlockTableRows()  # the running requests' block tables, kept between steps
        self.sampling = SamplingState(self.device, config.model.seed)  # generators, the last batch and sample
        self._host_ahead: tuple[SchedulerOutput, HostBatch] | None = None  # prepare_ahead's plan and host batch
        # (set before the memory profile below: its forward pass reads it)
        self.cuda_graphs: CudaGraphRunner | None = None
        self._capture_after_scales = False  # set below, once the profiling step has run
        block_bytes = sum(
            bytes_per_block(len(g.layers), self.block_size, self.num_kv_heads, g.kind.head_size, self.kv_dtype)
            for g in groups
        )
        reserve = activation_reserve_bytes(self)
        # the scheduler hands out one block count: every rank must hold that many
        self.num_blocks = tp.min_int(num_kv_blocks(config.cache, self.device, block_bytes, reserve), self.device)
        graphs = self._cuda_graph_plan()
        if graphs and self.num_blocks > 1 and config.cache.num_gpu_blocks is None:
            self.num_blocks -= 1  # the last block is the graphs' padding ("null") block, never scheduled
        self.kv_caches = self._allocate(self.num_blocks + (1 if graphs else 0))
        logger.info(
            "KV cache: %d blocks of %d tokens (%s, fp8 scales %s, %s)",
            self.num_blocks,
            self.block_size,
            str(self.kv_dtype).removeprefix("torch."),
            self.kv_scales_source,
            self.backend_name,
        )
        self._configure_pdl(config.enable_pdl)
        self.gemv_plan = None
        skinny = resolve_skinny_gemm(config.use_skinny_gemm, self.device.type, graphs, triton_installed())
        if tp.is_driver:
            warn_if_ignored(skinny)
        if skinny.on:  # before capture, so the graphs take the measured GEMV choices
            from attnserve.gemv import install_gemv_plan

            self.gemv_plan = install_gemv_plan(
                self.model, capture_sizes(config.scheduler.max_num_seqs), cache_root(), log=tp.is_driver
            )
        self.greedy_head = GreedyHead(self.gemv_plan.greedy_head if self.gemv_plan is not None else None)
        if self.device.type == "cuda":  # kernels compiled on first use meet a mixed step now (``warmup.py``)
            warm_up_mixed_steps(self)
        # calculate_kv_scales: the first prefill sets the scales, which the graphs' kernels take as constants, so
        # the graphs are captured after that step (``_hidden``); the profiling step above computed nothing
        self._capture_after_scales = graphs and config.cache.calculate_kv_scales
        for impl in self.attn_impls.values():
            impl.kv_scales_pending = config.cache.calculate_kv_scales
        if graphs and not self._capture_after_scales:
            self._capture_cuda_graphs()

    def _configure_pdl(self, requested: bool) -> None:
        """PDL launches of the Triton kernels (``kernels/pdl.py``) where the GPU has them, before the GEMV plan
        and graph capture."""
        from attnserve.kernels import pdl

        if pdl.configure(requested and pdl.supported(self.device)):
            logger.info("Triton kernels launch with programmatic dependent launch (enable_pdl)")

    def release(self) -> None:
        """Free the captured CUDA graphs, the model and the KV cache (before a process group is destroyed:
        graphs that captured NCCL collectives must go before their communicator)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.cuda_graphs = None
        self.model = None
        self.kv_caches = []
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _cuda_graph_plan(self) -> bool:
        """Whether decode steps will run as CUDA graphs; logs why not when they will not."""
        if self.device.type != "cuda" or self.config.enforce_eager:
            return False
        for g in self.attention.groups:
            backend = g.selection.backend_cls
            support = backend.capabilities(self.platform, self._attention_config(g.selection)).cuda_graph_support
            if support == CudaGraphSupport.NEVER:
                logger.info(
                    "CUDA graphs off: %s declares no CUDA-graph support; decode steps run eagerly", backend.name
                )
                return False
        return True

    def _capture_cuda_graphs(self) -> None:
        max_model_len = max_model_len_of(self.config.model, self.hf_config)
        self.cuda_graphs = CudaGraphRunner(
            self.model,
            self.builder,
            self.kv_caches,
            sizes=capture_sizes(self.config.scheduler.max_num_seqs),
            device=self.device,
            block_size=self.block_size,
            max_blocks=-(-max_model_len // self.block_size),
            null_block=self.num_blocks,
            max_model_len=max_model_len,
            cascade=(
                self.config.cache.enable_prefix_caching
                and not self.config.disable_cascade_attn
                and self.builder.supports_cascade
            ),
        )
        self.cuda_graphs.capture()
        logger.info(
            "CUDA graphs: captured %d decode batch sizes (%d to %d)%s in %.1f s",
            len(self.cuda_graphs.sizes),
            self.cuda_graphs.sizes[0],
            self.cuda_graphs.max_size,
            f", {len(self.cuda_graphs.cascade_graphs)} with cascade attention"
            if self.cuda_graphs.cascade_graphs
            else "",
            self.cuda_graphs.capture_seconds,
        )

    @property
    def backend_name(self) -> str:
        """The backend's name; with layer groups on different backends, theirs joined by ``+`` in group order."""
        return "+".join(dict.fromkeys(self.attention.backend_names))

    def _attention_config(self, selection):
        """The engine's attention config with the FlashAttention version ``selection`` resolved, if any."""
        if selection.flash_attn_version is None:
            return self.config.attention
        return dataclasses.replace(self.config.attention, flash_attn_version=selection.flash_attn_version)

    def _allocate(self, num_blocks: int) -> list[torch.Tensor]:
        """Each layer's KV cache in its layer group's backend shape and layout (list index = layer index)."""
        caches: list[torch.Tensor | None] = [None] * self.num_layers
        for g, builder in zip(self.attention.groups, self.builders):
            if hasattr(builder, "num_cache_blocks"):  # FLEX_ATTENTION sizes its block mask to the cache
                builder.num_cache_blocks = num_blocks
            tensors = allocate_kv_caches(
                g.selection.backend_cls,
                g.selection.kv_cache_layout,
                len(g.layers),
                num_blocks,
                self.block_size,
                self.num_kv_heads,
                g.kind.head_size,
                self.kv_dtype,
                self.device,
            )
            for layer, tensor in zip(g.layers, tensors):
                caches[layer] = tensor
        return caches

    def prepare(self, sched: SchedulerOutput) -> ForwardBatch:
        """Flatten the step's requests into one batch and build the backend's metadata once (eager path)."""
        return self._device_batch(host_batch(sched, self.block_size, self.block_table_rows))

    def _device_batch(self, host: HostBatch) -> ForwardBatch:
        """Copy a host batch to the device (pinned, non-blocking) and build the backend's metadata."""
        return device_batch(host, self.staging, self.builder, self.kv_caches, self.block_size)

    @torch.inference_mode()
    def compute_logits(self, sched: SchedulerOutput) -> torch.Tensor:  # (B, vocab) float32
        """Run the model on the step's tokens; logits at each request's last token, in float32."""
        return self._logits(sched).float()

    def _logits(self, sched: SchedulerOutput) -> torch.Tensor:  # (B, vocab) model dtype
        """The model's logits in its own dtype (the sampler upcasts only where it needs float32: a greedy
        step's argmax does not, and saves a (B, vocab) copy)."""
        return self.model.compute_logits(self._hidden(sched))

    def _hidden(self, sched: SchedulerOutput, prompt_plan: PromptLogprobsPlan | None = None) -> torch.Tensor:
        """The final hidden state at each request's last token of the step: the LM head's input, (B, hidden) in
        the model's dtype; with a ``prompt_plan``, followed by the plan's token rows.

        A pure-decode step within the captured batch sizes replays a CUDA graph; any other step runs eagerly.
        Placeholder token ids (async scheduling) are filled on the device from the last step's samples.
        """
        ahead, self._host_ahead = self._host_ahead, None
        host = (
            ahead[1]
            if ahead is not None and ahead[0] is sched
            else host_batch(sched, self.block_size, self.block_table_rows)
        )
        fill = placeholder_fill(sched, host, self.sampling, self.tp, self.staging)
        if prompt_plan is None and self.cuda_graphs is not None and self.cuda_graphs.can_run(host):
            return self.cuda_graphs.run(host, self.staging, fill)
        batch = self._device_batch(host)
        if fill is not None:
            fill(batch.input_ids)
        hidden = self.model(batch.input_ids, batch.positions, batch)
        if prompt_plan is not None:
            rows = np.concatenate([host.logits_indices, prompt_plan.token_index])
            hidden = hidden[self.staging.to_device("prompt_lp_rows", rows)]
        else:
            hidden = hidden[batch.logits_indices]
        if self._capture_after_scales:  # this step computed the fp8 scales the graphs take (calculate_kv_scales)
            self._capture_after_scales = False
            self._capture_cuda_graphs()
        return hidden

    def prepare_ahead(self, sched: SchedulerOutput) -> None:
        """Flatten a planned step into its host batch now (numpy only, no device work), for the ``queue_forward``
        of that same plan: the engine calls it while the device runs the step before (structured outputs)."""
        self._host_ahead = (
            None if sched.is_empty else (sched, host_batch(sched, self.block_size, self.block_table_rows))
        )

    def execute(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        """One step: forward pass and sampling; waits for the sampled tokens."""
        return self.execute_async(sched).result()

    @torch.inference_mode()
    def execute_async(self, sched: SchedulerOutput) -> "PendingStep":
        """Queue one step (forward pass, sampling, the tokens' copy to the host); returns without waiting.

        The sampled tokens stay on the device for the next step's placeholders (async scheduling).
        """
        return self.queue_forward(sched).sample(sched.grammar_bitmask)

    @torch.inference_mode()
    def queue_forward(self, sched: SchedulerOutput) -> "QueuedForward":
        """Queue the step's forward pass only; its ``sample(grammar_bitmask)`` queues the sampling. The engine
        fills a step's grammar bitmask (structured outputs) in between, while the device runs the forward pass:
        the mask needs the tokens of the step before, read only now."""
        self.sampling.forget(sched.finished_ids, sched.preempted_ids)
        self.block_table_rows.release(sched.finished_ids)
        self.logits_processors.free(sched.finished_ids + sched.preempted_ids)
        if sched.is_empty:
            return QueuedForward(self, [], None, None)
        # the pinned buffers are free once the last step's copies have left them; this step's copies all go
        # before the forward pass (the staging event is recorded after them, not after the step's kernels,
        # so the next step's host work never waits for this step's forward pass)
        self.staging.begin()
        rows = [i for i, r in enumerate(sched.requests) if r.samples]
        sample_rows = None
        if rows and len(rows) < len(sched.requests) and self.tp.is_driver:  # partial prefill rows do not sample
            sample_rows = self.staging.to_device("sample_rows", np.asarray(rows, dtype=np.int64))
        prompt_plan = PromptLogprobsPlan.of(sched)
        hidden = self._hidden(sched, prompt_plan)
        prompt_logprobs = {}
        if prompt_plan is not None:  # waits for the device: only steps of requests that asked for them
            num_reqs = len(sched.requests)
            prompt_logprobs = prompt_plan.compute(hidden[num_reqs:], self.model.compute_logits, self.tp.is_driver)
            hidden = hidden[:num_reqs]
        reqs = [sched.requests[i] for i in rows]
        # structured outputs: a step that samples from masked logits queues its LM head now, behind the forward
        # pass, so it runs while the host fills the bitmask (every rank: a vocabulary-parallel head gathers); a
        # step the fused greedy head takes masks inside that head, queued with the sampling
        params = [r.sampling_params for r in reqs]
        logits = (
            self.model.compute_logits(hidden)
            if any(p.structured_outputs is not None for p in params)
            and not (sample_rows is None and self.greedy_head.applies(params))
            else None
        )
        return QueuedForward(self, reqs, hidden, sample_rows, list(sched.requests), prompt_logprobs, logits)
