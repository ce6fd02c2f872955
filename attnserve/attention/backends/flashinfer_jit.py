"""FLASHINFER's JIT kernels compiled ahead, in the background, the slow one behind a fast interim.

FlashInfer 0.7.2 compiles each kernel module when a wrapper's ``plan()`` first asks for it, one after another
(the default model's first engine load on the H200: 119 s, most of it sm90's fa3 prefill module). There are no
precompiled kernels for 0.7.2 on PyPI (flashinfer-cubin stops at 0.6.13; flashinfer-jit-cache, which FlashInfer
finds by itself when installed, comes from FlashInfer's own index), so the engine lists, from its layer specs, the
modules the wrappers will load (:func:`flashinfer_modules.first_use`) and, in a thread started before the weights
load:

* ``now``: the decode module and an fa2 prefill module (for GQA one and the same), each compiled and loaded through
  FlashInfer's own cached getter in a thread of its own; the builder's first ``plan()`` waits for them (:func:`wait`);
* ``later``: the prefill module FlashInfer itself picks (fa3 on sm90), at a lower CPU priority; until it is loaded
  the builder plans its prefill on FlashInfer's fa2 kernel with the model-dtype query (:func:`pending_prefill`).

    settings = plan_settings(layer_spec, dtype, attention_config, takes_fp8_query(device))  # the builder's
    first_use([settings], resolve, compiled)                       # flashinfer_modules: which, now or later
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
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from attnserve.attention.backend import AttentionLayerSpec
from attnserve.attention.backends.flashinfer_modules import (
    FirstUse,
    KernelModule,
    PlanSettings,
    Resolver,
    first_use,
    kernel_modules,
    plan_settings,
    prefill_module,
    takes_fp8_query,
)

logger = logging.getLogger(__name__)
MIRRORED_VERSION = "0.7.2"  # decode.py / prefill.py / jit/attention/modules.py of flashinfer-python 0.7.2.post1
ON_ENV = "ATTNSERVE_FLASHINFER_COMPILE_AHEAD"  # "1": compile ahead; "0": FlashInfer's lazy compile
DEFAULT_ON = "1"  # ON_ENV's value when unset (measured against lazy: docs/benchmarks.md, FlashInfer's first use)


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


def compile_ahead_on() -> bool:
    """Whether the engine compiles FlashInfer's modules ahead (:data:`ON_ENV`, else :data:`DEFAULT_ON`)."""
    return os.environ.get(ON_ENV, DEFAULT_ON) == "1"


def start(
    specs: Iterable[AttentionLayerSpec], device: torch.device, dtype: torch.dtype, attention_config
) -> Warmup | None:
    """List the modules ``specs``' wrappers will load and compile the missing ones in a background thread
    (:func:`flashinfer_modules.first_use`: sm90's fa3 prefill after the others, behind the interim fa2 prefill).
    Idempotent per module set. Never raises: on any failure, logs once, returns None."""
    if not compile_ahead_on() or device.type != "cuda":
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
            item.error = _try_load(item.module, "prefill stays on fa2")
            if item.error is None:
                logger.info(
                    "FlashInfer's %s prefill kernels loaded after %.1f s in the background: prefill steps run "
                    "them from now on (FlashInfer's fa2 kernel until now)",
                    item.module.backend,
                    time.perf_counter() - t0,
                )
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
    error = _try_load(module, "kernels compile at first use")  # plan() then shows FlashInfer's own error
    if error is not None:
        warm.error = error


def _try_load(module: KernelModule, fallback: str) -> str | None:
    """:func:`load`; on a failure, logs it with what happens instead (``fallback``) and returns it as text."""
    try:
        load(module)
        return None
    except Exception as e:  # noqa: BLE001 - a background compile never fails the engine
        error = f"{type(e).__name__}: {e}"
        logger.warning("FlashInfer background compile failed (%s); %s", error, fallback)
        return error


def wait() -> None:
    """Block until every background build of this process has loaded the modules the first plan needs."""
    for warm in list(_WARMUPS.values()):
        warm.wait()


def pending_prefill(settings: PlanSettings, device: torch.device) -> Later | None:
    """The prefill module a builder of ``settings`` must not plan yet (compiling in the background; the builder
    runs :func:`flashinfer_modules.interim_prefill` until ``ready()``), or None: plan the prefill wrapper as it is."""
    if not settings.plans_prefill or not _LATER:
        return None
    try:
        return _LATER.get(prefill_module(settings, device_resolver(device)))
    except Exception as e:  # noqa: BLE001 - FlashInfer's resolver moved: plan the wrapper as it is (lazy compile)
        _log_once(logging.WARNING, f"FlashInfer's prefill backend not resolved ({type(e).__name__}: {e})")
        return None


def compiled_status(
    specs: Iterable[AttentionLayerSpec], device: torch.device, dtype: torch.dtype, attention_config
) -> dict[str, Any] | None:
    """``{"compiled": [...], "missing": [...], "ahead": bool}``: JitSpec names of ``specs``' modules on this machine
    and whether the engine compiles the missing ones ahead (:func:`compile_ahead_on`), or None where FlashInfer is
    absent, another version, or fails (no compile happens: ``is_compiled`` is a file check)."""
    try:
        import flashinfer

        if not str(getattr(flashinfer, "__version__", "")).startswith(MIRRORED_VERSION):
            return None
        loaded = loaded_specs(device_modules(specs, device, dtype, attention_config))
        return {
            "compiled": [s.name for s in loaded if s.is_compiled],
            "missing": [s.name for s in loaded if not s.is_compiled],
            "ahead": compile_ahead_on(),
        }
    except Exception:  # noqa: BLE001 - a report, never a failure
        return None
