"""Which FlashInfer JIT modules FLASHINFER's wrappers load for a model's layer groups, without FlashInfer.

The builder's plan settings (:func:`plan_settings`: dtypes, tensor cores, window, soft cap) decide the module
getters' arguments as FlashInfer 0.7.2's ``plan()`` passes them (:class:`KernelModule`); :func:`first_use` splits a
cold start's modules into those the first step waits for and those compiled behind an interim fa2 prefill.
FlashInfer's side (compiling, loading, the background thread): :mod:`flashinfer_jit`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

import torch

from attnserve.attention.backend import AttentionLayerSpec
from attnserve.attention.kv_cache_dtype import kv_cache_torch_dtype
from attnserve.kernels.kv_write import FP8_DTYPES

# (q_dtype, kv_dtype, head_dim) -> "fa2" | "fa3": FlashInfer's determine_attention_backend on the device
Resolver = Callable[[torch.dtype, torch.dtype, int], str]


def takes_fp8_query(device: torch.device) -> bool:
    """Whether FlashInfer's prefill kernel on ``device`` takes an fp8 query: its sm90 template (fa3) does, its
    fa2 kernels refuse one ("fp8 tensor core is not supported in fa2 backend"). ``device``: a CUDA device."""
    return torch.cuda.get_device_properties(device).major == 9


def query_dtypes(
    kv_dtype: torch.dtype, model_dtype: torch.dtype, attention_config, fp8_query: bool
) -> tuple[torch.dtype, torch.dtype]:
    """``(decode, prefill)`` query types the wrappers are planned for. The decode's is always the model dtype:
    FlashInfer's fp8-query decode runs its sm90 template, 3.4x slower than the fa2 tensor-core decode of a
    16-bit query over the same fp8 cache (docs/benchmarks.md, session 22), and fa2 refuses an fp8 query; vLLM
    also quantizes only for its TRT-LLM kernels. The prefill's is the fp8 cache's type where the kernel takes it
    (``fp8_query``: :func:`takes_fp8_query`) unless ``disable_flashinfer_q_quantization``."""
    keep = attention_config is not None and attention_config.disable_flashinfer_q_quantization
    quantize = kv_dtype in FP8_DTYPES and fp8_query and not keep
    return model_dtype, kv_dtype if quantize else model_dtype


@dataclass(frozen=True)
class PlanSettings:
    """What the builder plans FlashInfer's wrappers with for one layer group (and so which kernels they load)."""

    head_size: int
    dtype: torch.dtype  # the model's: the output type
    kv_dtype: torch.dtype
    decode_q_dtype: torch.dtype  # query_dtypes(): always the model's
    prefill_q_dtype: torch.dtype  # the fp8 cache's where quantized
    # tensor-core decode for GQA (the grouped query heads of a KV head form the MMA's rows)
    tensor_cores: bool
    # "fa2" is what "auto" resolves to for a 16-bit query; naming it skips auto's per-plan cuDNN probe (two
    # `import cudnn` attempts per eager plan() where cudnn-frontend is not installed)
    decode_backend: str
    window_left: int  # -1 = full attention
    logits_soft_cap: float  # 0.0 = none
    plans_prefill: bool  # False with disable_flashinfer_prefill: the prefill wrapper is never planned


def plan_settings(spec: AttentionLayerSpec, dtype: torch.dtype, attention_config, fp8_query: bool) -> PlanSettings:
    """The builder's wrapper settings for ``spec`` with model dtype ``dtype``; ``fp8_query``: whether the
    device's prefill kernel takes an fp8 query (:func:`takes_fp8_query`)."""
    kv = kv_cache_torch_dtype(spec.kv_cache_dtype, dtype)
    decode_q, prefill_q = query_dtypes(kv, dtype, attention_config, fp8_query)
    return PlanSettings(
        head_size=spec.head_size,
        dtype=dtype,
        kv_dtype=kv,
        decode_q_dtype=decode_q,
        prefill_q_dtype=prefill_q,
        tensor_cores=spec.num_heads != spec.num_kv_heads,
        decode_backend="fa2",
        window_left=spec.sliding_window - 1 if spec.sliding_window else -1,
        logits_soft_cap=spec.logits_soft_cap or 0.0,
        plans_prefill=not (attention_config is not None and attention_config.disable_flashinfer_prefill),
    )


@dataclass(frozen=True)
class KernelModule:
    """One JIT module a wrapper's plan() loads, as the arguments of FlashInfer's module getter:
    ``get_batch_decode_module(*args)`` (``getter`` "decode", the CUDA-core decode) or
    ``get_batch_prefill_module(backend, *args)`` ("prefill": the paged prefill and the tensor-core decode)."""

    getter: str
    backend: str | None  # prefill: "fa2" or "fa3", resolved as plan() resolves it; decode: None
    q_dtype: torch.dtype
    kv_dtype: torch.dtype
    o_dtype: torch.dtype
    head_dim: int
    use_sliding_window: bool
    use_logits_soft_cap: bool

    def name(self) -> str:
        """A short label for logs: ``decode`` or ``prefill/fa2``, with the head dim and the KV dtype."""
        kind = self.getter if self.backend is None else f"{self.getter}/{self.backend}"
        return f"{kind} (head {self.head_dim}, KV {str(self.kv_dtype).removeprefix('torch.')})"

    def args(self) -> tuple:
        """The getter's positional arguments after ``backend``: dtypes, index dtype (int32 page arrays), head dims
        (qk = vo), pos_encoding_mode 0 (NONE), window, soft cap, and for prefill use_fp16_qk_reduction False."""
        head = (self.q_dtype, self.kv_dtype, self.o_dtype, torch.int32, self.head_dim, self.head_dim, 0)
        flags = (self.use_sliding_window, self.use_logits_soft_cap)
        return head + flags + ((False,) if self.getter == "prefill" else ())


def decode_module(s: PlanSettings) -> KernelModule:
    """BatchDecodeWithPagedKVCacheWrapper._plan_impl (decode.py, FlashInfer 0.7.2 lines 2370-2452): tensor cores
    -> get_batch_prefill_module with the wrapper's backend (``decode_backend``: fa2); otherwise
    get_batch_decode_module. Sliding window there is ``window_left != -1``."""
    getter = "prefill" if s.tensor_cores else "decode"
    window, cap = s.window_left != -1, s.logits_soft_cap > 0
    backend = s.decode_backend if s.tensor_cores else None
    return KernelModule(getter, backend, s.decode_q_dtype, s.kv_dtype, s.dtype, s.head_size, window, cap)


def prefill_module(s: PlanSettings, resolve: Resolver) -> KernelModule:
    """BatchPrefillWithPagedKVCacheWrapper.plan (prefill.py, FlashInfer 0.7.2 lines 3669-3696): backend "auto"
    -> determine_attention_backend (no custom mask), then get_batch_prefill_module; window ``window_left >= 0``."""
    backend = resolve(s.prefill_q_dtype, s.kv_dtype, s.head_size)
    window, cap = s.window_left >= 0, s.logits_soft_cap > 0
    return KernelModule("prefill", backend, s.prefill_q_dtype, s.kv_dtype, s.dtype, s.head_size, window, cap)


def kernel_modules(settings: Iterable[PlanSettings], resolve: Resolver) -> list[KernelModule]:
    """The modules the decode and prefill wrappers of these layer groups load, each once, in first-use order
    (decode, then prefill, group by group). Pure: ``resolve`` stands in for the device's fa2/fa3 choice."""
    found: dict[KernelModule, None] = {}
    for s in settings:
        found[decode_module(s)] = None
        if s.plans_prefill:
            found[prefill_module(s, resolve)] = None
    return list(found)


def interim_prefill(s: PlanSettings) -> KernelModule:
    """The prefill module run while sm90's fa3 one compiles in the background: FlashInfer's fa2 template with the
    model-dtype query (fa2 takes no fp8 one). For GQA it is the tensor-core decode's module itself."""
    return prefill_module(replace(s, prefill_q_dtype=s.dtype), lambda q, kv, head_dim: "fa2")


@dataclass(frozen=True)
class FirstUse:
    """What a start compiles: ``now`` before the first plan, ``later`` in the background behind the interim
    prefill (sm90's fa3 prefill: ~100 s of nvcc for one module on the H200, against ~30 s for the fa2 one)."""

    now: list[KernelModule]
    later: list[KernelModule]


def first_use(
    settings: Iterable[PlanSettings], resolve: Resolver, compiled: Callable[[KernelModule], bool]
) -> FirstUse:
    """The uncompiled modules of these layer groups, split as :class:`FirstUse` says: a prefill module other than
    fa2's waits behind :func:`interim_prefill` unless it is already compiled. Pure (``resolve``, ``compiled``:
    FlashInfer's choice of template and its file check)."""
    now: dict[KernelModule, None] = {}
    later: dict[KernelModule, None] = {}
    for s in settings:
        now[decode_module(s)] = None
        if not s.plans_prefill:
            continue
        prefill = prefill_module(s, resolve)
        if prefill.backend == "fa2" or compiled(prefill):
            now[prefill] = None
        else:
            now[interim_prefill(s)] = None
            later[prefill] = None
    return FirstUse([m for m in now if not compiled(m)], list(later))
