"""The method objects a GemvPlan installs: each holds a table (row count 0..``MAX_ROWS`` -> a function or None,
``choices.bucket_table``) and runs the table's function for a step's row count, or the plain computation.

A lookup is a tuple index: no host sync, CUDA-graph capturable. Layers call only their method object
(``layers/linear.py``: ``quant_method``, vLLM's name; ``layers/mlp.py``: ``mlp_method``), so the model code
has no branch for any of this.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from attnserve.layers.linear import UnquantizedLinearMethod
from attnserve.layers.mlp import SwiGLUMethod

Table = tuple  # row count (index 0..MAX_ROWS) -> a function or None


def table_entry(table: Table | None, rows: int) -> Callable | None:
    """A table's function for ``rows`` rows, or None (no table, past its row counts, or not chosen)."""
    return table[rows] if table is not None and rows < len(table) else None


class GemvLinearMethod(UnquantizedLinearMethod):
    """A linear layer's (or LM head's) ``quant_method`` where the plan chose a faster GEMV for some row counts:
    ``table[T](x, weight, bias)`` (the Triton GEMV or ``blas.cublaslt_linear``) for T rows, else ``F.linear``."""

    def __init__(self, table: Table) -> None:
        self.table = table

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        f = table_entry(self.table, x.shape[0])
        return super().apply(layer, x, bias) if f is None else f(x, layer.weight, bias)


class _FusedInput(UnquantizedLinearMethod):
    """One table entry as a linear method: ``f(x, layer.weight, bias)`` (a GEMV that transforms its input)."""

    def __init__(self, f: Callable) -> None:
        self.f = f

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return self.f(x, layer.weight, bias)


class SwiGLUGemvMethod(SwiGLUMethod):
    """A SwiGLU MLP's ``mlp_method`` where the plan chose to fuse the SwiGLU into a GEMV for some row counts.

    ``swiglu``: row count -> a GEMV ``f(x, gate_up.weight, gate_up.bias)`` whose epilogue applies the SwiGLU
    ((T, local I) out; this rank's gate/up weight is ``[gate; up]`` of its columns, so it holds under tensor
    parallelism too), followed by the down projection. ``silu_mul``: row count -> a GEMV ``f(gate_up_out,
    down.weight, bias)`` that applies the SwiGLU to its input (the same bits as ``silu_and_mul`` then the plain
    GEMV: ``triton_gemv``), run through the down projection's all-reduce. The plan picks at most one of the two
    per row count; neither: gate/up, ``silu_and_mul``, down."""

    def __init__(self, swiglu: Table | None, silu_mul: Table | None) -> None:
        self.swiglu = swiglu
        self.silu_mul = silu_mul
        # the prologue GEMVs as the down projection's methods (run through its all-reduce)
        self.down_methods = None if silu_mul is None else tuple(_FusedInput(f) if f else None for f in silu_mul)

    def apply(self, mlp: nn.Module, x: torch.Tensor) -> torch.Tensor:  # (T, hidden) -> (T, hidden)
        rows = x.shape[0]
        f = table_entry(self.swiglu, rows)
        if f is not None:
            up = mlp.gate_up_proj
            return mlp.down_proj(f(x, up.weight, up.bias))
        down = table_entry(self.down_methods, rows)
        if down is None:
            return super().apply(mlp, x)
        return mlp.down_proj.apply_method(down, mlp.gate_up_proj(x))


class FusedGreedyHead:
    """``logits(hidden).argmax(-1)`` of an LM head without the logits (``triton_greedy_head``), for the row
    counts where the plan measured it faster: ``self(hidden, grammar)`` is (B,) int64, or None for a row count it
    does not cover (``covers``; the caller then computes the logits). ``grammar``: a ``GrammarBitmask`` on the
    device (structured outputs), applied to the logits inside the head, or None. Used by the model runner's
    ``GreedyHead`` sampler strategy."""

    def __init__(self, head: nn.Module, table: Table) -> None:
        self.head = head
        self.table = table

    def covers(self, rows: int) -> bool:
        return table_entry(self.table, rows) is not None

    @torch.inference_mode()
    def warm_masked(self) -> None:
        """Run the masked head (a grammar bitmask, with and without a row index) once at every row count it
        covers: its kernels are compiled, or loaded from Triton's cache, now rather than in a constrained step."""
        rows = [m for m in range(1, len(self.table)) if self.table[m] is not None]
        if not rows:
            return
        weight = self.head.weight
        hidden = torch.zeros(rows[-1], weight.shape[1], dtype=weight.dtype, device=weight.device)
        words = torch.zeros(rows[-1], 1, dtype=torch.int32, device=weight.device)
        for m in rows:
            index = torch.zeros(m, dtype=torch.int32, device=weight.device)
            for mask_index in (None, index):
                self.table[m](hidden[:m], weight, mask_words=words[:m], mask_index=mask_index, mask_tokens=32)

    def __call__(self, hidden: torch.Tensor, grammar=None) -> torch.Tensor | None:  # (B, hidden) -> (B,) int64
        f = table_entry(self.table, hidden.shape[0])
        if f is None:
            return None
        if grammar is None:
            return f(hidden, self.head.weight)
        if grammar.rows is not None:
            raise ValueError("the fused greedy head takes a bitmask's row index (GrammarBitmask.to(with_index=True))")
        return f(
            hidden, self.head.weight, mask_words=grammar.words, mask_index=grammar.index, mask_tokens=grammar.num_tokens
        )
