"""Programmatic dependent launch (PDL) for attnserve's Triton kernels, on compute capability 9.0 and later.

Without PDL a kernel starts only when the kernel before it on the stream has finished: between two kernels
of a decode step the GPU launches, schedules thread blocks and waits for the first loads (microseconds each),
and a step of a 32-layer model has ~400 such boundaries. With PDL (CUDA Programming Guide, 4.5
"Programmatic Dependent Launch and Synchronization"; in Triton the ``launch_pdl=True`` launch option and
``tl.extra.cuda.gdc_wait`` / ``gdc_launch_dependents``, triton-lang/triton#6394) a kernel may start while the
one before it still runs. Each of our kernels launched that way follows one protocol:

1. before ``gdc_wait()``: index math and loads of weights only (no kernel writes a weight during inference);
2. ``gdc_wait()``: blocks until the kernels before it on the stream have completed and their writes are
   visible. Every kernel in the chain waits before it ends, so the wait is transitive;
3. ``gdc_launch_dependents()``: the next PDL-launched kernel may now start its own step 1 on free SMs;
4. the rest: loads of activations, the KV cache, stores.

A kernel that is not ours (cuBLAS, FlashAttention-3) is launched normally: it starts after ours complete,
and ours after it as soon as it ends (it never signals early). FlashInfer launches its attention kernels
with PDL itself on these GPUs (its ``enable_pdl`` default).

The switch is one process-wide launch option, set once by each model runner from ``EngineConfig.enable_pdl``
(on by default) and the GPU (:func:`configure`), before any graph is captured. On CPU, under the Triton
interpreter and on GPUs below compute capability 9.0 it stays off.

The outputs are the same bits (``tests/gpu/test_pdl_gpu.py``); TPOT with PDL off and on
(``attnserve bench latency``, ``benchmarks/gpu/bench_pdl.py``) is in docs/benchmarks.md. Tried and dropped:
asking L2 to prefetch the first 2-8 KB of each GEMV weight row before the wait (slower). Kept instead: the GEMV
loads its first weight tile into registers before the wait. TRITON_ATTN's paged attention and split merge
launch with PDL too.
"""

from __future__ import annotations

import torch

_state = {"enabled": False}


def supported(device: torch.device | str) -> bool:
    """Whether ``device`` is a CUDA GPU of compute capability 9.0 or later (PDL's requirement)."""
    device = torch.device(device)
    return device.type == "cuda" and torch.cuda.is_available() and torch.cuda.get_device_capability(device)[0] >= 9


def configure(enabled: bool) -> bool:
    """Turn PDL launches of the Triton kernels on or off for this process; returns the setting. Call before
    capturing CUDA graphs: a captured launch keeps the option it was captured with."""
    _state["enabled"] = bool(enabled)
    return _state["enabled"]


def enabled() -> bool:
    """Whether the Triton kernels launch with PDL (on CUDA tensors)."""
    return _state["enabled"]


def launch(x: torch.Tensor) -> dict:
    """The keyword arguments of a Triton launch whose inputs live on ``x``'s device: ``USE_PDL`` (the
    kernels' constexpr) and, when it is on, ``launch_pdl=True``."""
    if _state["enabled"] and x.is_cuda:
        return {"USE_PDL": True, "launch_pdl": True}
    return {"USE_PDL": False}
