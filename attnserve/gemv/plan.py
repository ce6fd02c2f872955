"""GemvPlan: the measured choices of a model's GEMVs, and the method objects it installs on the model's layers.

A plan holds one record per measured (N, K, M) (``choices.py``; measured by ``measure.py``). :meth:`GemvPlan.install`
turns them into tables (row count 0..``MAX_ROWS`` -> the chosen function, the Triton GEMV or cuBLASLt, or None
for cuBLAS; row counts between buckets (3, 5..7, 9..15, 17..31, 33..47, 49..63: the LM head sees the exact request
count, and an eager step of that many tokens reads the same table) use the next measured bucket's choice; past
the largest measured bucket, cuBLAS) and gives each layer that wins somewhere a method object holding its
table (``methods.py``); the others keep their plain matmul. Set once, before the CUDA graphs are captured.

SwiGLU MLPs (``layers.mlp.SwiGLUMLP``: gate/up, ``silu_and_mul``, down) get two more tables. For the down
projection, whose input is ``silu_and_mul`` of the gate/up output, the plan times "``silu_and_mul``, then the
choice above (cuBLAS or the Triton GEMV)" against the fused GEMV (``triton_gemv.gemv(gate_up, weight,
act="silu_mul")``: one launch instead of two) over the same candidate configurations, and keeps the fused one
only where its best is faster by the same margin and agrees with ``F.linear(silu_and_mul(gate_up), weight)``.

For the gate/up projection the plan times "the layer's choice above, then ``silu_and_mul``" against the GEMV
with the SwiGLU in its epilogue (``gemv(x, gate_up_weight, out_act="silu_mul")``: one launch, no (M, 2I)
intermediate) over the layer's candidate configurations, and keeps it where it is faster by the same margin; a
candidate counts only if its plain GEMV agrees with ``F.linear`` and the fused one returns ``silu_and_mul`` of
that plain output bit for bit. Where both ends of an MLP would fuse the SwiGLU at one row count, the pair of
(gate/up, down) launches that is faster in total keeps its fusion (``benchmarks/gpu/bench_gate_up_swiglu.py``;
figures in docs/benchmarks.md). The MLP gets one method object with both tables (``methods.SwiGLUGemvMethod``).

The LM head gets a third table: for each row count the plan times the LM head's choice above followed by the
greedy argmax (``triton_argmax``) against the fused greedy head (``triton_greedy_head.greedy_head``: the argmax
of each logits tile in the LM head's epilogue, no (M, vocab) logits written or read) over its candidate tiles,
and keeps the fused one where it is faster by the same margin and its logits agree with ``F.linear`` (its
tokens being their argmax). It becomes ``GemvPlan.greedy_head`` (``methods.FusedGreedyHead``), which the model
runner's sampler strategy uses for steps whose every row is greedy without logprobs.

Triton is imported when a plan is measured or installed, never by importing this module.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field, replace
from typing import Callable

import torch
from torch import nn

from attnserve.gemv.choices import GemvChoice, GreedyChoice, SiluMulChoice, bucket_table, chosen_gemv
from attnserve.gemv.methods import FusedGreedyHead, GemvLinearMethod, SwiGLUGemvMethod

logger = logging.getLogger("attnserve.gemv")


def lm_head(model: nn.Module) -> nn.Module | None:
    """The module whose ``logits(hidden)`` are the model's logits unchanged (the model's ``logits_head()``: an
    untied ``ParallelLMHead`` or the tied embedding); None when the model has none or changes its logits (a
    final soft cap)."""
    logits_head = getattr(model, "logits_head", None)
    return None if logits_head is None else logits_head()


def gemv_layers(model: nn.Module) -> list[tuple[nn.Module, torch.Tensor]]:
    """(module, weight) of every layer whose ``quant_method`` a plan may replace: the column- and row-parallel
    linear layers and the LM head (an untied ``ParallelLMHead``, else the tied embedding)."""
    from attnserve.layers.embedding import ParallelLMHead, VocabParallelEmbedding
    from attnserve.layers.linear import ColumnParallelLinear, RowParallelLinear

    mods = list(model.modules())
    heads = [m for m in mods if isinstance(m, ParallelLMHead)] or [
        m for m in mods if isinstance(m, VocabParallelEmbedding)
    ]
    linears = [m for m in mods if isinstance(m, (ColumnParallelLinear, RowParallelLinear))]
    return [(m, m.weight) for m in linears + heads]


def swiglu_mlps(model: nn.Module) -> list[nn.Module]:
    """The model's SwiGLU MLPs (``layers.mlp.SwiGLUMLP``: gate/up, ``silu_and_mul``, down)."""
    from attnserve.layers.mlp import SwiGLUMLP

    return [m for m in model.modules() if isinstance(m, SwiGLUMLP)]


def plan_shapes(model: nn.Module) -> list[tuple[str, int, int]]:
    """(kind, N, K) of every weight shape a plan of ``model`` measures: ``linear`` for each distinct shape of
    :func:`gemv_layers` (in model order), ``down`` / ``gate_up`` for the SwiGLU MLPs' projections (timed fused
    too), ``greedy`` for an unsharded 16-bit LM head (timed as the fused greedy head too)."""
    shapes = [("linear", n, k) for n, k in dict.fromkeys(tuple(w.shape) for _, w in gemv_layers(model))]
    mlps = swiglu_mlps(model)
    shapes += sorted({("down", *mlp.down_proj.weight.shape) for mlp in mlps})
    shapes += sorted({("gate_up", *mlp.gate_up_proj.weight.shape) for mlp in mlps})
    head = lm_head(model)
    if head is not None and head.tp.size == 1 and head.weight.dtype in (torch.float16, torch.bfloat16):
        shapes.append(("greedy", *head.weight.shape))
    return shapes


def _set_method(module: nn.Module, name: str, method: object | None) -> None:
    """``module.<name> = method``; None puts back the class's default (the plain computation)."""
    if method is None:
        module.__dict__.pop(name, None)
    else:
        setattr(module, name, method)


@dataclass
class GemvPlan:
    """The measured choices, keyed by (N, K, M); :meth:`install` hands each layer its method object."""

    choices: dict[tuple[int, int, int], GemvChoice] = field(default_factory=dict)
    seconds: float = 0.0
    silu_mul: dict[tuple[int, int, int], SiluMulChoice] = field(default_factory=dict)  # SwiGLU layers' shapes
    greedy: dict[int, GreedyChoice] = field(default_factory=dict)  # the LM head's rows: fused greedy head or not
    swiglu: dict[tuple[int, int, int], SiluMulChoice] = field(default_factory=dict)  # gate/up layers' shapes
    # set by install: the fused LM head + argmax for the row counts where it won (None: nowhere, or no such head)
    greedy_head: FusedGreedyHead | None = None

    def table(self, n: int, k: int) -> tuple[Callable | None, ...] | None:
        """Row count (index 0..MAX_ROWS) -> the chosen GEMV ``f(x, weight, bias)`` (the Triton GEMV or
        ``blas.cublaslt_linear``), or None for cuBLAS; None when cuBLAS wins at every row count of (N, K)."""
        return bucket_table({m: chosen_gemv(c) for (nn_, kk, m), c in self.choices.items() if (nn_, kk) == (n, k)})

    def silu_mul_table(self, n: int, k: int) -> tuple[Callable | None, ...] | None:
        """Row count -> the chosen fused GEMV ``f(gate_up (M, 2K), weight, bias)``, or None for
        ``silu_and_mul`` then :meth:`table`'s choice; None when the fused GEMV wins at no row count."""
        from attnserve.kernels.triton_gemv import gemv

        return bucket_table(
            {
                m: functools.partial(gemv, config=c.config, act="silu_mul") if c.use_fused else None
                for (nn_, kk, m), c in self.silu_mul.items()
                if (nn_, kk) == (n, k)
            }
        )

    def swiglu_table(self, n: int, k: int) -> tuple[Callable | None, ...] | None:
        """Row count -> the chosen GEMV ``f(x, gate_up_weight, bias)`` with the SwiGLU in its epilogue ((M, N / 2)
        out), or None for :meth:`table`'s choice then ``silu_and_mul``; None when it wins at no row count."""
        from attnserve.kernels.triton_gemv import gemv

        return bucket_table(
            {
                m: functools.partial(gemv, config=c.config, out_act="silu_mul") if c.use_fused else None
                for (nn_, kk, m), c in self.swiglu.items()
                if (nn_, kk) == (n, k)
            }
        )

    def greedy_table(self) -> tuple[Callable | None, ...] | None:
        """Row count -> the fused greedy head ``f(hidden, weight)`` with its measured tile, or None (the LM head
        then an argmax); None when it wins at no row count."""
        from attnserve.kernels.triton_greedy_head import greedy_head

        return bucket_table(
            {
                m: functools.partial(greedy_head, config=c.config) if c.use_fused else None
                for m, c in self.greedy.items()
            }
        )

    def install(self, model: nn.Module) -> GemvPlan:
        """Give every linear layer and LM head with a table a ``GemvLinearMethod`` (the others keep their plain
        ``quant_method``), every SwiGLU MLP with a fused table a ``SwiGLUGemvMethod`` (the others keep the SwiGLU
        its own kernel), and set :attr:`greedy_head`; logs how many layers use Triton."""
        used = 0
        tables: dict[tuple[int, int], tuple | None] = {}
        for module, weight in gemv_layers(model):
            key = tuple(weight.shape)
            if key not in tables:
                tables[key] = self.table(*key)
            _set_method(module, "quant_method", None if tables[key] is None else GemvLinearMethod(tables[key]))
            used += tables[key] is not None
        fused = 0
        mlps = swiglu_mlps(model)
        for mlp in mlps:
            swiglu = self.swiglu_table(*mlp.gate_up_proj.weight.shape)
            silu_mul = self.silu_mul_table(*mlp.down_proj.weight.shape)
            _set_method(
                mlp, "mlp_method", None if swiglu is None and silu_mul is None else SwiGLUGemvMethod(swiglu, silu_mul)
            )
            fused += (swiglu is not None) + (silu_mul is not None)
        head = lm_head(model)
        greedy = self.greedy_table() if head is not None and head.tp.size == 1 else None
        self.greedy_head = None if greedy is None else FusedGreedyHead(head, greedy)
        logger.info(
            "GEMV plan: %d of %d linear layers use the Triton GEMV for some decode batch sizes; "
            "%d of %d SwiGLU layers and gate/up layers the fused SwiGLU GEMV",
            used,
            len(gemv_layers(model)),
            fused,
            2 * len(mlps),
        )
        return self

    @classmethod
    def measure(
        cls,
        model: nn.Module,
        ms: tuple[int, ...] | None = None,
        margin: float | None = None,
        calls: int = 20,
        replays: int = 10,
    ) -> GemvPlan:
        """``measure.measure_plan``: time every layer shape of ``model`` at the row counts ``ms``."""
        from attnserve.gemv.measure import measure_plan

        return measure_plan(model, ms, margin, calls, replays)

    def _choice_us(self, n: int, k: int, m: int) -> float:
        """The measured time of (N, K, M)'s plain choice (cuBLAS, cuBLASLt or the Triton GEMV), microseconds."""
        c = self.choices[(n, k, m)]
        return c.triton_us if c.use_triton else c.cublaslt_us if c.use_cublaslt else c.cublas_us

    def _one_swiglu_fusion_per_mlp(self) -> None:
        """Where a gate/up shape (2I, H) and its down shape (H, I) both chose a fused SwiGLU at one row count,
        keep the one whose (gate/up, down) pair is faster: the epilogue's fused time plus down's plain choice,
        against gate/up's plain choice plus the prologue's fused time; the other falls back to unfused."""
        for (n, k, m), up in list(self.swiglu.items()):
            down = self.silu_mul.get((k, n // 2, m))
            if not (up.use_fused and down is not None and down.use_fused):
                continue
            epilogue = up.fused_us + self._choice_us(k, n // 2, m)
            prologue = self._choice_us(n, k, m) + down.fused_us
            if epilogue < prologue:
                self.silu_mul[(k, n // 2, m)] = replace(down, use_fused=False)
            else:
                self.swiglu[(n, k, m)] = replace(up, use_fused=False)

    def summary(self) -> str:
        lines = [f"{'N':>7} {'K':>6} {'M':>2} {'cuBLAS us':>10} {'cuBLASLt us':>11} {'Triton us':>10}  choice"]
        for (n, k, m), c in sorted(self.choices.items()):
            tri = f"{c.triton_us:10.2f}" if c.triton_us is not None else f"{'-':>10}"
            lt = f"{c.cublaslt_us:11.2f}" if c.cublaslt_us is not None else f"{'-':>11}"
            lines.append(f"{n:>7} {k:>6} {m:>2} {c.cublas_us:10.2f} {lt} {tri}  {c.label()}")
        for title, table, unfused in (
            (
                "SwiGLU layers: silu_and_mul + the choice above vs the fused SwiGLU GEMV",
                self.silu_mul,
                "silu_and_mul + {}",
            ),
            ("gate/up layers: the choice above + silu_and_mul vs the SwiGLU in the GEMV's epilogue", self.swiglu, "{}"),
            (
                "greedy steps: the LM head's choice + argmax vs the fused greedy head",
                {(c.n, c.k, m): c for m, c in self.greedy.items()},
                "{}",
            ),
        ):
            if table:
                lines.append(f"{title}\n{'N':>7} {'K':>6} {'M':>2} {'unfused us':>10} {'fused us':>10}  choice")
                for (n, k, m), c in sorted(table.items()):
                    fused = f"{c.fused_us:10.2f}" if c.fused_us is not None else f"{'-':>10}"
                    what = f"fused {c.config.label()}" if c.use_fused and c.config else unfused.format(c.unfused_label)
                    lines.append(f"{n:>7} {k:>6} {m:>2} {c.unfused_us:10.2f} {fused}  {what}")
        return "\n".join(lines)
