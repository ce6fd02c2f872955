"""Pieces every attnserve Triton kernel shares: the numerics switches, float32 -> 16-bit rounding, libdevice's
``exp``/``rsqrt`` (numpy's under the interpreter), the PDL wait, and the ticket counters of the kernels whose
last program reduces a split (:func:`ticket_counters`). Importing this module imports Triton.

Numerics: every kernel loads its inputs, computes in float32 and rounds to the storage dtype exactly where
the PyTorch definition in ``fused_ops.py`` rounds (after each PyTorch op whose output is 16-bit). A
product of two bf16 (or fp16) values is exact in float32, so ``weight * y`` rounded once equals PyTorch's
16-bit multiply. Three choices keep the kernels on PyTorch's CUDA rounding:

- floating-point contraction is off (``enable_fp_fusion=False``, :data:`LAUNCH_OPTIONS`): ``x1 * cos - x2 * sin``
  is two rounded products and a rounded difference, as in PyTorch's separate elementwise kernels, not an FMA;
- divisions are IEEE (``div_rn``; Triton's ``/`` on float32 is the 2-ulp ``div.full``), and ``exp`` and
  ``rsqrt`` are libdevice's, the functions nvcc compiles ``expf``/``rsqrtf`` in PyTorch's kernels to;
- the RMSNorm statistic ``mean(x^2)`` is a float32 sum in another order than PyTorch's reduction, so it
  may differ in the last float32 bit, which flips the rounding of a 16-bit output in rare elements (by 1
  ulp). That is the only difference from the PyTorch path.

Under the Triton interpreter (``TRITON_INTERPRET=1``: the kernels run on CPU tensors, for tests)
libdevice is unavailable, so ``exp``/``rsqrt`` are numpy's, and the interpreter's float32 -> bfloat16
cast does not round to nearest even, so :func:`round_rne` does that rounding with integer ops there.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

INTERPRETED = bool(triton.knobs.runtime.interpret)
# no FMA contraction (see the module docstring)
LAUNCH_OPTIONS = dict(enable_fp_fusion=False)
# counters per ticket buffer: the rows or tiles one split launch of a kernel can take
TICKETS = 1 << 16
_tickets: dict[tuple[str, torch.device], torch.Tensor] = {}


def ticket_counters(owner: str, device: torch.device | str) -> torch.Tensor:
    """``owner``'s (a kernel module's name) int32 ticket counters on ``device``: ``TICKETS`` zeros, allocated
    once and kept. A split launch's programs each take a ticket from their row's or tile's counter and the
    one that draws the last reduces the splits and resets the counter to 0 (the CUDA samples'
    ``threadFenceReduction``: ``triton_gemv``'s split-K, ``triton_argmax``'s column chunks), so the buffer
    needs no memset between launches, and launches of one owner on one device must not run concurrently.
    Raises RuntimeError when first needed inside a CUDA-graph capture (the buffer must outlive every graph)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    buf = _tickets.get((owner, device))
    if buf is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"{owner}: its ticket counters on {device} must be allocated before CUDA-graph "
                "capture (they must outlive every graph)"
            )
        buf = _tickets[owner, device] = torch.zeros(TICKETS, dtype=torch.int32, device=device)
    return buf


@triton.jit
def round_rne(x, dtype: tl.constexpr, INTERPRET: tl.constexpr):
    """float32 ``x`` rounded to nearest (ties to even) in ``dtype``."""
    if INTERPRET and dtype == tl.bfloat16:  # the interpreter's cast truncates; round in the bits
        bits = x.to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return x.to(dtype)


@triton.jit
def pdl_wait(USE_PDL: tl.constexpr):
    """Steps 2 and 3 of ``kernels/pdl.py``'s protocol in a kernel launched with ``launch_pdl``: wait for the
    kernels before it, then let the next one start. A no-op without PDL."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def libdevice_rsqrt(x, INTERPRET: tl.constexpr):
    if INTERPRET:
        return tl.rsqrt(x)
    else:
        return libdevice.rsqrt(x)


@triton.jit
def libdevice_exp(x, INTERPRET: tl.constexpr):
    if INTERPRET:
        return tl.exp(x)
    else:
        return libdevice.exp(x)
