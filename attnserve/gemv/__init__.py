"""The skinny-GEMM plan (``use_skinny_gemm``): where a Triton GEMV (``kernels/triton_gemv.py``), cuBLASLt, a
GEMV with the SwiGLU fused in, or a fused LM head + argmax beats cuBLAS on this GPU, measured at start-up for
the decode row counts the CUDA graphs run, and installed on the model's layers as method objects.

- ``choices``: the records of what was measured, and the row-count tables they become.
- ``measure``: the start-up timing (``timing``: a decode step's view of a kernel; ``tiles``: the launch
  configurations tried; ``blas``: ``F.linear`` through cuBLASLt).
- ``plan``: ``GemvPlan``, which installs the winners (``methods``: a linear layer's ``quant_method``, a SwiGLU
  MLP's ``mlp_method``, and the fused greedy head the sampler's strategy calls).
- ``plan_cache``: the measured choices on disk (``plan_json``), keyed by GPU, versions, dtype, shapes and code,
  so that a second start loads them instead of timing.
- ``enable``: whether the plan runs (``use_skinny_gemm`` unset: wherever it has an effect).

The model code calls only its layers' method objects; the model runner calls only :func:`install_gemv_plan`.
Triton is imported when a plan is measured, never by importing this package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

if TYPE_CHECKING:
    from attnserve.gemv.plan import GemvPlan


def install_gemv_plan(
    model: nn.Module, graph_sizes: list[int], cache_root: str | None = None, log: bool = True
) -> GemvPlan:
    """Measure the plan for ``model`` at the CUDA-graph batch sizes ``graph_sizes`` (``cuda_graph.capture_sizes``;
    those up to ``choices.MAX_ROWS``), or load it from attnserve's cache folder ``cache_root`` (``plan_cache``:
    saved there when measured; None: always measured, nothing saved), and install it; call before the graphs
    are captured, so they take its choices. ``log``: the line saying measured or loaded (the tensor-parallel
    driver's). Whether to call it at all is :func:`attnserve.gemv.enable.resolve_skinny_gemm`'s answer."""
    from attnserve.gemv.choices import plan_rows
    from attnserve.gemv.plan import GemvPlan, gemv_layers

    rows = plan_rows(graph_sizes)
    if cache_root is None or not gemv_layers(model):
        return GemvPlan.measure(model, rows).install(model)
    from attnserve.gemv.plan_cache import cached_plan, model_key_inputs, plan_key, plan_path

    inputs = model_key_inputs(model, rows)
    plan, _ = cached_plan(plan_path(cache_root, plan_key(inputs)), inputs, lambda: GemvPlan.measure(model, rows), log)
    return plan.install(model)
