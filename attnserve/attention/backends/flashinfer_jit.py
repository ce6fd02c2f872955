"""FLASHINFER's JIT kernels compiled ahead, in the background, the slow one behind a fast interim.

FlashInfer 0.7.2 compiles each kernel module when a wrapper's ``plan()`` first asks for it, one after another
(the default model's first engine load on the H200: 119 s, most of it sm90's fa3 prefill module). There are no
precompiled kernels for 0.7.2 on PyPI (flashinfer-cubin stops at 0.6.13; flashinfer-jit-cache, which FlashInfer
finds by itself when installed, comes from FlashInfer's own index), so the engine lists, from its layer specs, the
modules the wrappers will load (:func:`first_use`) and, in a thread started before the weights load:

* ``now``: the decode module and an fa2 prefill module (for GQA one and the same), each compiled and loaded through
  FlashInfer's own cached getter in a thread of its own; the builder's first ``plan()`` waits for them (:func:`wait`);
* ``later``: the prefill module FlashInfer itself picks (fa3 on sm90), at a lower CPU priority; until it is loaded
  the builder plans its prefill on FlashInfer's fa2 kernel with the model-dtype query (:func:`pending_prefill`).

    settings = plan_settings(layer_spec, dtype, attention_config, takes_fp8_query(device))  # the builder's
    first_use([settings], resolve, compiled)                       # pure: which modules, now or later
    start(layer_specs, device, dtype, attention_config)            # FlashInfer: the thread
    wait(); pending_prefill(settings, device)                      # the builder

Whatever fails here is logged once and leaves FlashInfer's own lazy compile in charge; another FlashInfer version
than the one whose internals this mirrors (:data:`MIRRORED_VERSION`) is skipped with a log line.
``ATTNSERVE_FLASHINFER_COMPILE_AHEAD``: "1" on, "0" FlashInfer's lazy compile; :data:`DEFAULT_ON` when unset
(``python -m benchmarks.gpu.flashinfer_first_use`` times both on a GPU).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from attnserve.attention.backend import AttentionLayerSpec
from attnserve.attention.kv_cache_dtype import kv_cache_torch_dtype
from attnserve.kernels.kv_write import FP8_DTYPES

logger = logging.getLogger(__name__)

MIRRORED_VERSION = "0.7.2"  # decode.py / prefill.py / jit/attention/modules.py of flashinfer-python 0.7.2.post1
ON_ENV = "ATTNSERVE_FLASHINFER_COMPILE_AHEAD"  # "1": compile ahead; "0": FlashInfer's lazy compile
DEFAULT_ON = "0"  # ON_ENV's value when unset
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


def _decode_module(s: PlanSettings) -> KernelModule:
    """BatchDecodeWithPagedKVCacheWrapper._plan_impl (decode.py, FlashInfer 0.7.2 lines 2370-2452): tensor cores
    -> get_batch_prefill_module with the wrapper's backend (``decode_backend``: fa2); otherwise
    get_batch_decode_module. Sliding window there is ``window_left != -1``."""
    getter = "prefill" if s.tensor_cores else "decode"
    window, cap = s.window_left != -1, s.logits_soft_cap > 0
    backend = s.decode_backend if s.tensor_cores else None
    return KernelModule(getter, backend, s.decode_q_dtype, s.kv_dtype, s.dtype, s.head_size, window, cap)


def _prefill_module(s: PlanSettings, resolve: Resolver) -> KernelModule:
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
        found[_decode_module(s)] = None
        if s.plans_prefill:
            found[_prefill_module(s, resolve)] = None
    return list(found)


def interim_prefill(s: PlanSettings) -> KernelModule:
    """The prefill module run while sm90's fa3 one compiles in the background: FlashInfer's fa2 template with the
    model-dtype query (fa2 takes no fp8 one). For GQA it is the tensor-core decode's module itself."""
    window, cap = s.window_left >= 0, s.logits_soft_cap > 0
    return KernelModule("prefill", "fa2", s.dtype, s.kv_dtype, s.dtype, s.head_size, window, cap)


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
        now[_decode_module(s)] = None
        if not s.plans_prefill:
            continue
        prefill = _prefill_module(s, resolve)
        if prefill.backend == "fa2" or compiled(prefill):
            now[prefill] = None
        else:
            now[interim_prefill(s)] = None
            later[prefill] = None
    return FirstUse([m for m in now if not compiled(m)], [m for m in later if m not in now])


# ------------------------------------------------------------------------------------------ FlashInfer's side
def device_resolver(device: torch.device) -> Resolver:
    """FlashInfer's own choice for ``device`` (fa3 on sm90 where its FA3 kernels take the dtypes and head dims)."""
    from flashinfer.utils import determine_attention_backend

    def resolve(q: torch.dtype, kv: torch.dtype, head_dim: int) -> str:
        return determine_attention_backend(device, 0, False, False, q, kv, head_dim_qk=head_dim, head_dim_vo=head_dim)

    return resolve


def device_modules(
    specs: Iterable[AttentionLayerSpec], device: torch.device, dtype: torch.dtype, attention_config
) -> list[KernelModule]:
    """The modules ``specs``' wrappers load on ``device``: their builders' plan settings, resolved there."""
    fp8_query = takes_fp8_query(device)
    settings = [plan_settings(s, dtype, attention_config, fp8_query) for s in specs]
    return kernel_modules(settings, device_resolver(device))


def jit_specs(module: KernelModule) -> tuple[list, list]:
    """``(loaded, lazy)`` JitSpecs of ``module``, as FlashInfer's getter makes them (decode.py 536
    get_batch_decode_module; prefill.py 535 get_batch_prefill_module). ``lazy``: fa2's independent-stride paged
    module, built only when K and V strides differ, never for our cache (one tensor, unbound on dim 1)."""
    from flashinfer.jit.attention import modules as m

    if module.getter == "decode":
        return [m.gen_batch_decode_module(*module.args())], []
    if module.backend == "fa2":
        primary = m._gen_batch_prefill_primary_module("fa2", *module.args())
        return [primary], [m._gen_batch_prefill_independent_paged_module("fa2", *module.args())]
    return [m.gen_batch_prefill_module(module.backend, *module.args())], []


def loaded_specs(modules: Iterable[KernelModule]) -> list:
    """The JitSpecs plan() loads for ``modules`` (:func:`jit_specs`' first lists, in order)."""
    return [spec for module in modules for spec in jit_specs(module)[0]]


def load(module: KernelModule) -> None:
    """Compile ``module`` where missing and load it, through the cached getter plan() itself calls: plan() then
    finds it loaded. (FlashInfer's ``build_jit_specs`` compiles into another ninja log than the getter's build
    reads, so the getter compiled every module a second time: session 22's 280 s.)"""
    if module.getter == "decode":
        from flashinfer.decode import get_batch_decode_module

        get_batch_decode_module(*module.args())
    else:
        from flashinfer.prefill import get_batch_prefill_module

        get_batch_prefill_module(module.backend, *module.args())


@dataclass
class Later:
    """A module compiled behind the interim prefill: ``done`` is set once it is loaded or has failed."""

    module: KernelModule
    done: threading.Event
    error: str | None = None

    def ready(self) -> bool:
        """Loaded: the builder may plan its wrapper now (never after a failure: the interim stays)."""
        return self.done.is_set() and self.error is None


@dataclass
class Warmup:
    """One background build: the modules the first plan waits for (``first.now``), those compiled after them
    behind the interim prefill (``first.later``), the thread."""

    first: FirstUse
    thread: threading.Thread | None
    started: float
    now_done: threading.Event
    error: str | None = None
    waited: bool = False

    @property
    def modules(self) -> list[KernelModule]:
        return self.first.now + self.first.later

    def wait(self) -> None:
        """Block until ``first.now`` is loaded (or failed); ``first.later`` goes on in the background."""
        if self.thread is None or self.waited:
            return
        t = time.perf_counter()
        self.now_done.wait()
        self.waited = True
        if self.error is None:
            logger.info(
                "FlashInfer kernels compiled ahead: the first plan waited %.1f s (%.1f s since the build started)",
                time.perf_counter() - t,
                time.perf_counter() - self.started,
            )


_WARMUPS: dict[frozenset, Warmup] = {}
_LATER: dict[KernelModule, Later] = {}
_LOCK = threading.Lock()


@functools.cache
def _log_once(level: int, message: str) -> None:
    logger.log(level, message)


def start(
    specs: Iterable[AttentionLayerSpec], device: torch.device, dtype: torch.dtype, attention_config
) -> Warmup | None:
    """List the modules ``specs``' wrappers will load and compile the missing ones in a background thread
    (:func:`first_use`: sm90's fa3 prefill after the others, behind the interim fa2 prefill). Idempotent per
    module set. Never raises: on any failure, logs once, returns None."""
    if os.environ.get(ON_ENV, DEFAULT_ON) != "1" or device.type != "cuda":
        return None
    try:
        import flashinfer

        version = str(getattr(flashinfer, "__version__", "unknown"))
        if not version.startswith(MIRRORED_VERSION):
            _log_once(
                logging.INFO,
                f"FlashInfer {version}: not compiling its kernels ahead (mirrored for {MIRRORED_VERSION}); "
                "they compile at their first use",
            )
            return None
        fp8_query = takes_fp8_query(device)
        settings = [plan_settings(s, dtype, attention_config, fp8_query) for s in specs]
        first = first_use(settings, device_resolver(device), _is_compiled)
        with _LOCK:
            key = frozenset(first.now + first.later)
            if key in _WARMUPS:
                return _WARMUPS[key]
            _WARMUPS[key] = warm = _start(first)
        return warm
    except Exception as e:  # noqa: BLE001 - another FlashInfer's internals, an import error: lazy compile
        _log_once(logging.WARNING, f"FlashInfer kernels not compiled ahead ({type(e).__name__}: {e}); lazy compile")
        return None


def _is_compiled(module: KernelModule) -> bool:
    return all(s.is_compiled for s in jit_specs(module)[0])


def _start(first: FirstUse) -> Warmup:
    warm = Warmup(first, None, time.perf_counter(), threading.Event())
    if not first.now and not first.later:
        logger.debug("FlashInfer kernels already compiled")
        warm.now_done.set()
        return warm
    for module in first.later:
        _LATER.setdefault(module, Later(module, threading.Event()))
    later = [_LATER[m] for m in first.later]

    def build() -> None:
        loaders = [threading.Thread(target=_load_now, args=(m, warm), daemon=True) for m in first.now]
        for t in loaders:
            t.start()
        for t in loaders:
            t.join()
        warm.now_done.set()
        if later:  # behind the engine's own work: this thread, and the compilers it starts, at a lower priority
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        for item in later:
            t0 = time.perf_counter()
            try:
                load(item.module)
                logger.info(
                    "FlashInfer's %s prefill kernels loaded after %.1f s in the background: prefill steps run "
                    "them from now on (FlashInfer's fa2 kernel until now)",
                    item.module.backend,
                    time.perf_counter() - t0,
                )
            except Exception as e:  # noqa: BLE001 - the interim prefill stays
                item.error = f"{type(e).__name__}: {e}"
                logger.warning("FlashInfer background compile failed (%s); prefill stays on fa2", item.error)
            item.done.set()

    logger.info(
        "FlashInfer: first use on this machine of %d kernel modules for this model; compiling %s now (the first "
        "step waits for them) and %s in the background (prefill steps run FlashInfer's fa2 kernel meanwhile)",
        len(first.now) + len(first.later),
        ", ".join(m.name() for m in first.now) or "none",
        ", ".join(m.name() for m in first.later) or "none",
    )
    warm.thread = threading.Thread(target=build, name="flashinfer-compile-ahead", daemon=True)
    warm.thread.start()
    return warm


def _load_now(module: KernelModule, warm: Warmup) -> None:
    try:
        load(module)
    except Exception as e:  # noqa: BLE001 - plan() then compiles lazily and shows FlashInfer's own error
        warm.error = f"{type(e).__name__}: {e}"
        logger.warning("FlashInfer background compile failed (%s); kernels compile at first use", warm.error)


def wait() -> None:
    """Block until every background build of this process has loaded the modules the first plan needs."""
    for warm in list(_WARMUPS.values()):
        warm.wait()


def pending_prefill(settings: PlanSettings, device: torch.device) -> Later | None:
    """The prefill module a builder of ``settings`` must not plan yet (compiling in the background; the builder
    runs :func:`interim_prefill` until ``ready()``), or None: plan the prefill wrapper as it is."""
    if not settings.plans_prefill or not _LATER:
        return None
    try:
        return _LATER.get(_prefill_module(settings, device_resolver(device)))
    except Exception as e:  # noqa: BLE001 - FlashInfer's resolver moved: plan the wrapper as it is (lazy compile)
        _log_once(logging.WARNING, f"FlashInfer's prefill backend not resolved ({type(e).__name__}: {e})")
        return None


def compiled_status(
    specs: Iterable[AttentionLayerSpec], device: torch.device, dtype: torch.dtype, attention_config
) -> dict[str, Any] | None:
    """``{"compiled": [...], "missing": [...]}`` JitSpec names of ``specs``' modules on this machine, or None where
    FlashInfer is absent, another version, or fails (no compile happens: ``is_compiled`` is a file check)."""
    try:
        import flashinfer

        if not str(getattr(flashinfer, "__version__", "")).startswith(MIRRORED_VERSION):
            return None
        loaded = loaded_specs(device_modules(specs, device, dtype, attention_config))
        return {
            "compiled": [s.name for s in loaded if s.is_compiled],
            "missing": [s.name for s in loaded if not s.is_compiled],
        }
    except Exception:  # noqa: BLE001 - a report, never a failure
        return None
