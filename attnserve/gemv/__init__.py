"""The skinny-GEMM plan (``use_skinny_gemm``): where a Triton GEMV (``kernels/triton_gemv.py``), cuBLASLt, a
GEMV with the SwiGLU fused in, or a fused LM head + argmax beats cuBLAS on this GPU, measured at start-up for
the decode row counts the CUDA graphs run, and installed on the model's layers as method objects.

- ``choices``: the records of what was measured, and the row-count tables they become.
- ``measure``: the start-up timing (``timing``: a decode step's view of a kernel; ``tiles``: the launch
  configurations tried; ``blas``: ``F.linear`` through cuBLASLt).
- ``plan``: ``GemvPlan``, which installs the winners (``methods``: a linear layer's ``quant_method``, a SwiGLU
  MLP's ``mlp_method``, and the fused greedy head the sampler's strategy calls).

The model code calls only its layers' method objects; the model runner calls only :func:`install_gemv_plan`.
Triton is imported when a plan is measured, never by importing this package.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from torch import nn

if TYPE_CHECKING:
    from attnserve.gemv.plan import GemvPlan

logger = logging.getLogger("attnserve.gemv")


def install_gemv_plan(model: nn.Module, graph_sizes: list[int] | None, log: bool = True) -> GemvPlan | None:
    """Measure the plan for ``model`` at the CUDA-graph batch sizes ``graph_sizes`` (``cuda_graph.capture_sizes``;
    those up to ``choices.MAX_ROWS``) and install it; call before the graphs are captured, so they take the
    measured choices. ``graph_sizes`` None (no CUDA graphs: the plan serves graph decode steps only): nothing
    is measured or installed, and (``log``) a warning says why; returns None then."""
    if graph_sizes is None:
        if log:
            device = next(model.parameters()).device
            logger.warning(
                "use_skinny_gemm has no effect here: the Triton GEMV runs in CUDA-graph decode steps "
                "only (this engine: %s)",
                "no CUDA" if device.type != "cuda" else "CUDA graphs off",
            )
        return None
    from attnserve.gemv.choices import plan_rows
    from attnserve.gemv.plan import GemvPlan

    return GemvPlan.measure(model, plan_rows(graph_sizes)).install(model)
