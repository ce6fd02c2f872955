"""GemvPlan: where the Triton GEMV (``triton_gemv.py``) beats cuBLAS on this GPU, measured at start-up.

For every distinct weight shape (N, K) of the model's linear layers and LM head, and each decode batch
size M of the CUDA-graph buckets up to ``MAX_ROWS`` = 64 that the engine captures (by default 1, 2, 4, 8,
16, 32, 48, 64; :func:`plan_rows` of ``cuda_graph.capture_sizes(max_num_seqs)``), the plan times
``F.linear`` (cuBLAS) and at most 6 Triton launch configurations (:func:`candidate_configs`), and keeps
Triton only where its best one is faster by ``margin`` (5%) and agrees with ``F.linear``; it also times
``F.linear`` through cuBLASLt (``blas.cublaslt_linear``) and takes it where it beats cuBLAS by ``LT_MARGIN``
(2%) and Triton is not faster still (an H200, Llama-3.1-8B shapes at 64 rows: down 35.9 -> 31.4 us). Batch 16..64
is measured too: there cuBLAS's GEMMs are still latency-bound (an H200 at batch 64, Qwen3-0.6B shapes:
5-6 us each, plus a 1.9 us split-K reduce kernel for gate_up, for weights that stream in 1-3 us; see
``triton_gemv``); the LM head at 64 rows is a large GEMM where cuBLAS likely stays, and the plan decides.
Each layer then holds a small table (``layer.gemv``: row count 0..``MAX_ROWS`` -> the chosen function, the
Triton GEMV or cuBLASLt, or None for cuBLAS), set once; the forward pass reads one attribute when the table
is unset. Row counts between
buckets (3, 5..7, 9..15, 17..31, 33..47, 49..63: the LM head sees the exact request count, and an eager
step of that many tokens reads the same table) use the next measured bucket's choice; past the largest
measured bucket, cuBLAS.

Start-up cost: per (N, K, M) one cuBLAS timing and up to 6 Triton ones (each a CUDA graph of >= 20 calls,
replayed 11 times), plus one Triton compile per distinct launch (tile, stages, warps, padded rows, split or
not, K tail or not; not the row count itself). For the Llama-3.1-8B and Qwen3-0.6B shapes with rows
1..64: ~310-320 timings (estimated 5-10 s on an H200, most of it the LM head's) and ~60-70 distinct kernels (~0.4 s
each to compile for sm_90 on one CPU core, ~20-25 s; Triton caches them on disk for the next start), about
twice the work of rows 1..8. ``measure`` logs its time and counts.

Timing imitates a decode step inside a CUDA graph (``gemv_timing.py``: one graph of back-to-back calls
cycling through copies of the weight whose total exceeds twice the L2 cache); the launch configurations
tried are ``gemv_tiles.py``'s.

SwiGLU layers (a ``RowParallelLinear`` built with ``silu_mul_input``: the MLP's down projection, whose
input is ``silu_and_mul`` of the gate/up output) get a second table, ``layer.gemv_silu_mul``: for each
row count the plan also times "``silu_and_mul``, then the choice above (cuBLAS or the Triton GEMV)" against
the fused GEMV (``triton_gemv.gemv(gate_up, weight, act="silu_mul")``: one launch instead of two) over the
same candidate configurations, and keeps the fused one only where its best is faster by the same margin
and agrees with ``F.linear(silu_and_mul(gate_up), weight)``.

The gate/up layers that feed a SwiGLU (``MergedColumnParallelLinear(swiglu_output=True)``) get a table of
their own, ``layer.gemv_swiglu``: for each row count the plan times "the layer's choice above, then
``silu_and_mul``" against the GEMV with the SwiGLU in its epilogue (``gemv(x, gate_up_weight,
out_act="silu_mul")``: one launch, no (M, 2I) intermediate) over the layer's candidate configurations, and
keeps it where it is faster by the same margin; a candidate counts only if its plain GEMV agrees with
``F.linear`` and the fused one returns ``silu_and_mul`` of that plain output bit for bit. Where both ends of
an MLP would fuse the SwiGLU at one row count, the pair of (gate/up, down) launches that is faster in total
keeps its fusion. Measured on an H200 (``benchmarks/gpu/bench_gate_up_swiglu.py``, gate/up + ``silu_and_mul`` vs
fused): Qwen3-0.6B 1 row 6.47 -> 4.61 us, 16 rows 7.60 -> 5.72 us; Llama-3.1-8B 1 row 54.8 -> 52.6 us.

The LM head gets a third table, ``head.greedy``: for each row count the plan times the LM head's choice above
followed by the greedy argmax (``triton_argmax``) against the fused greedy head
(``triton_greedy_head.greedy_head``: the argmax of each logits tile in the LM head's epilogue, no (M, vocab)
logits written or read) over its candidate tiles, and keeps the fused one where it is faster by the same
margin and its logits agree with ``F.linear`` (its tokens being their argmax). The model runner uses it for
steps whose every row is greedy without logprobs.

Triton is imported when a plan is measured, never by importing this module.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable

import torch
import torch.nn.functional as F
from torch import nn

from attnserve.layers.gemv_tiles import candidate_configs
from attnserve.layers.blas import cublaslt_linear
from attnserve.layers.gemv_timing import agrees, l2_bytes, time_candidates, time_per_call_us, weight_copies

if TYPE_CHECKING:
    from attnserve.kernels.triton_gemv import GemvConfig

logger = logging.getLogger(__name__)

DECODE_MS = (1, 2, 4, 8, 16, 32, 48, 64)  # the decode CUDA-graph buckets up to MAX_ROWS (cuda_graph.capture_sizes)
MAX_ROWS = 64  # row counts above this always take cuBLAS (triton_gemv.MAX_M)
MARGIN = 0.05  # Triton must be this much faster than cuBLAS to be used
LT_MARGIN = 0.02  # cuBLASLt (the same kind of kernels, another heuristic) this much

def plan_rows(sizes: list[int] | tuple[int, ...] | None = None) -> tuple[int, ...]:
    """The row counts a plan measures: the CUDA-graph batch sizes ``sizes`` (``cuda_graph.capture_sizes``;
    None: ``DECODE_MS``) of 1..``MAX_ROWS`` rows, ascending."""
    return tuple(sorted({s for s in (DECODE_MS if sizes is None else sizes) if 1 <= s <= MAX_ROWS}))


# --------------------------------------------------------------------------------------------- the plan
def pick_fastest(reference_us: float, timed: list[tuple[float, GemvConfig]],
                 margin: float) -> tuple[float | None, GemvConfig | None, bool]:
    """The fastest of ``timed`` (microseconds, config; the candidates that ran and agreed) as (its time, its
    config, whether it replaces the reference: at most ``1 - margin`` of ``reference_us``); (None, None,
    False) when nothing was timed. Ties keep the first."""
    if not timed:
        return None, None, False
    us, cfg = min(timed, key=lambda t: t[0])
    return us, cfg, us <= (1.0 - margin) * reference_us


@dataclass(frozen=True)
class GemvChoice:
    """One measured (N, K, M): cuBLAS's time, the best Triton candidate and its time, and the verdict."""

    n: int
    k: int
    m: int
    cublas_us: float
    triton_us: float | None  # None: no candidate ran (or none agreed with F.linear)
    config: GemvConfig | None  # the best candidate
    use_triton: bool
    cublaslt_us: float | None = None  # F.linear through cuBLASLt (None: not measured, or disagreed)
    use_cublaslt: bool = False  # cuBLASLt instead of cuBLAS (never with use_triton)

    def label(self) -> str:
        """What runs: ``triton <config>``, ``cuBLASLt`` or ``cuBLAS``."""
        return f"triton {self.config.label()}" if self.use_triton else "cuBLASLt" if self.use_cublaslt else "cuBLAS"


@dataclass(frozen=True)
class SiluMulChoice:
    """One measured (N, K, M) of a SwiGLU layer: ``silu_and_mul`` then the plain choice (``unfused``: cuBLAS
    or the chosen Triton config, its label in ``unfused_label``) against the best fused GEMV. For a down
    projection (``GemvPlan.silu_mul``) K is its input width I and the fused GEMV reads (M, 2I); for a gate/up
    layer (``GemvPlan.swiglu``) N is 2I, the plain choice runs before ``silu_and_mul`` and the fused GEMV
    writes (M, I)."""

    n: int
    k: int
    m: int
    unfused_us: float
    unfused_label: str
    fused_us: float | None  # None: no candidate ran (or none agreed)
    config: GemvConfig | None  # the best fused candidate
    use_fused: bool


@dataclass(frozen=True)
class GreedyChoice:
    """One measured row count M of the LM head (N, K): its choice then the argmax (``unfused``) against the best
    fused greedy head."""

    n: int
    k: int
    m: int
    unfused_us: float
    unfused_label: str
    fused_us: float | None  # None: no candidate ran (or none agreed)
    config: object | None  # the best triton_greedy_head.GreedyHeadConfig
    use_fused: bool


def lm_head(model: nn.Module) -> nn.Module | None:
    """The module whose ``logits`` the model's LM head is: the last of :func:`gemv_layers` when it is a
    ``VocabParallelEmbedding`` (an untied ``ParallelLMHead`` or the tied embedding)."""
    from attnserve.layers.embedding import VocabParallelEmbedding

    layers = gemv_layers(model)
    return layers[-1][0] if layers and isinstance(layers[-1][0], VocabParallelEmbedding) else None


def gemv_layers(model: nn.Module) -> list[tuple[nn.Module, torch.Tensor]]:
    """(module, weight) of every layer that consults ``module.gemv``: the column- and row-parallel linear
    layers and the LM head (an untied ``ParallelLMHead``, else the tied embedding)."""
    from attnserve.layers.embedding import ParallelLMHead, VocabParallelEmbedding
    from attnserve.layers.linear import ColumnParallelLinear, RowParallelLinear

    mods = list(model.modules())
    heads = ([m for m in mods if isinstance(m, ParallelLMHead)]
             or [m for m in mods if isinstance(m, VocabParallelEmbedding)])
    linears = [m for m in mods if isinstance(m, (ColumnParallelLinear, RowParallelLinear))]
    return [(m, m.weight) for m in linears + heads]


def silu_mul_layers(model: nn.Module) -> list[nn.Module]:
    """The layers whose input is SwiGLU of a gate/up output (``RowParallelLinear(silu_mul_input=True)``)."""
    from attnserve.layers.linear import RowParallelLinear

    return [m for m in model.modules() if isinstance(m, RowParallelLinear) and m.silu_mul_input]


def swiglu_layers(model: nn.Module) -> list[nn.Module]:
    """The gate/up layers whose output goes to a SwiGLU (``MergedColumnParallelLinear(swiglu_output=True)``)."""
    from attnserve.layers.linear import MergedColumnParallelLinear

    return [m for m in model.modules() if isinstance(m, MergedColumnParallelLinear) and m.swiglu_output]


def _bucket_table(chosen: dict[int, Callable | None]) -> tuple[Callable | None, ...] | None:
    """Row count (index 0..MAX_ROWS) -> the GEMV chosen at the smallest measured bucket >= it (``chosen``:
    bucket (1..MAX_ROWS) -> GEMV or None); None past the largest bucket, and None for the whole table when
    no row count has a GEMV."""
    measured = sorted(chosen)
    entries: list[Callable | None] = [None] * (MAX_ROWS + 1)
    for rows in range(1, MAX_ROWS + 1):
        bucket = next((m for m in measured if m >= rows), None)
        entries[rows] = chosen[bucket] if bucket is not None else None
    return tuple(entries) if any(entries) else None


def _chosen(c: GemvChoice) -> Callable | None:
    """The function a choice runs, None for cuBLAS."""
    if c.use_triton:
        from attnserve.kernels.triton_gemv import gemv

        return functools.partial(gemv, config=c.config)
    return cublaslt_linear if c.use_cublaslt else None


@dataclass
class GemvPlan:
    """The measured choices, keyed by (N, K, M); :meth:`apply` hands each layer its table."""

    choices: dict[tuple[int, int, int], GemvChoice] = field(default_factory=dict)
    seconds: float = 0.0
    silu_mul: dict[tuple[int, int, int], SiluMulChoice] = field(default_factory=dict)  # SwiGLU layers' shapes
    greedy: dict[int, GreedyChoice] = field(default_factory=dict)  # the LM head's rows: fused greedy head or not
    swiglu: dict[tuple[int, int, int], SiluMulChoice] = field(default_factory=dict)  # gate/up layers' shapes

    def table(self, n: int, k: int) -> tuple[Callable | None, ...] | None:
        """Row count (index 0..MAX_ROWS) -> the chosen GEMV ``f(x, weight, bias)`` (the Triton GEMV or
        ``blas.cublaslt_linear``), or None for cuBLAS; None when cuBLAS wins at every row count of (N, K)."""
        return _bucket_table({m: _chosen(c) for (nn_, kk, m), c in self.choices.items() if (nn_, kk) == (n, k)})

    def silu_mul_table(self, n: int, k: int) -> tuple[Callable | None, ...] | None:
        """Row count -> the chosen fused GEMV ``f(gate_up (M, 2K), weight, bias)``, or None for
        ``silu_and_mul`` then :meth:`table`'s choice; None when the fused GEMV wins at no row count."""
        from attnserve.kernels.triton_gemv import gemv

        return _bucket_table({m: functools.partial(gemv, config=c.config, act="silu_mul") if c.use_fused else None
                              for (nn_, kk, m), c in self.silu_mul.items() if (nn_, kk) == (n, k)})

    def swiglu_table(self, n: int, k: int) -> tuple[Callable | None, ...] | None:
        """Row count -> the chosen GEMV ``f(x, gate_up_weight, bias)`` with the SwiGLU in its epilogue ((M, N / 2)
        out), or None for :meth:`table`'s choice then ``silu_and_mul``; None when it wins at no row count."""
        from attnserve.kernels.triton_gemv import gemv

        return _bucket_table({m: functools.partial(gemv, config=c.config, out_act="silu_mul") if c.use_fused else None
                              for (nn_, kk, m), c in self.swiglu.items() if (nn_, kk) == (n, k)})

    def greedy_table(self) -> tuple[Callable | None, ...] | None:
        """Row count -> the fused greedy head ``f(hidden, weight)`` with its measured tile, or None (the LM head
        then an argmax); None when it wins at no row count."""
        from attnserve.kernels.triton_greedy_head import greedy_head

        return _bucket_table({m: functools.partial(greedy_head, config=c.config) if c.use_fused else None
                              for m, c in self.greedy.items()})

    def apply(self, model: nn.Module) -> GemvPlan:
        """Set ``layer.gemv`` on every layer (None where cuBLAS stays), ``layer.gemv_silu_mul`` on the SwiGLU
        layers and ``layer.gemv_swiglu`` on the gate/up layers (None where the SwiGLU stays its own kernel);
        logs how many layers use Triton."""
        used = 0
        tables: dict[tuple[int, int], tuple | None] = {}
        for module, weight in gemv_layers(model):
            key = tuple(weight.shape)
            if key not in tables:
                tables[key] = self.table(*key)
            module.gemv = tables[key]
            used += tables[key] is not None
        fused = 0
        silu_mul = silu_mul_layers(model)
        for module in silu_mul:
            module.gemv_silu_mul = self.silu_mul_table(*module.weight.shape)
            fused += module.gemv_silu_mul is not None
        gate_up = swiglu_layers(model)
        for module in gate_up:
            module.gemv_swiglu = self.swiglu_table(*module.weight.shape)
            fused += module.gemv_swiglu is not None
        head = lm_head(model)
        if head is not None:
            head.greedy = self.greedy_table()
        logger.info("GEMV plan: %d of %d linear layers use the Triton GEMV for some decode batch sizes; "
                    "%d of %d SwiGLU layers and gate/up layers the fused SwiGLU GEMV", used, len(gemv_layers(model)),
                    fused, len(silu_mul) + len(gate_up))
        return self

    @classmethod
    def measure(cls, model: nn.Module, ms: tuple[int, ...] | None = None, margin: float | None = None,
                calls: int = 20, replays: int = 10) -> GemvPlan:
        """Time cuBLAS and :func:`candidate_configs` for each distinct layer shape and row count in ``ms``
        (default ``DECODE_MS``; pass :func:`plan_rows` of the engine's CUDA-graph sizes; counts past
        ``MAX_ROWS`` are dropped); Triton is used where its best time is at most ``1 - margin`` (default
        ``MARGIN``) of cuBLAS's. For the SwiGLU layers' shapes, then time ``silu_and_mul`` + that choice
        against the fused candidates (:meth:`_measure_silu_mul`), with the same margin. Logs the seconds
        taken and the number of timings."""
        margin = MARGIN if margin is None else margin
        ms = plan_rows(ms)
        from attnserve.kernels.triton_gemv import gemv, prepare
        from attnserve.kernels.triton_greedy_head import CANDIDATES as GREEDY_CANDIDATES

        t0 = time.perf_counter()
        plan = cls()
        shapes = dict.fromkeys(tuple(w.shape) for _, w in gemv_layers(model))
        weights = {tuple(w.shape): w for _, w in gemv_layers(model)}
        silu_mul_shapes = {tuple(m.weight.shape) for m in silu_mul_layers(model)}
        swiglu_shapes = {tuple(m.weight.shape) for m in swiglu_layers(model)}
        head = lm_head(model)
        head_shape = tuple(head.weight.shape) if head is not None and head.tp.size == 1 else None
        if not shapes or not ms:
            return plan
        any_w = next(iter(weights.values()))
        device, dtype = any_w.device, any_w.dtype
        prepare(device)
        num_sms = torch.cuda.get_device_properties(device).multi_processor_count
        timings = 0
        with torch.no_grad():
            for n, k in shapes:
                copies = weight_copies(weights[(n, k)], 2 * l2_bytes(device))
                for m in ms:
                    x = torch.randn(m, k, device=device, dtype=dtype)
                    cublas = time_per_call_us(lambda w: F.linear(x, w), copies, calls, replays)
                    want = F.linear(x, copies[0])
                    cands = candidate_configs(n, k, m, dtype.itemsize, num_sms)
                    timed = time_candidates(lambda w, cfg: gemv(x, w, None, cfg), want, copies, n, k, m, cands,
                                             calls, replays)
                    timings += 1 + len(cands)
                    best_us, best_cfg, use = pick_fastest(cublas, timed, margin)
                    lt = time_per_call_us(lambda w: cublaslt_linear(x, w), copies, calls, replays) \
                        if agrees(cublaslt_linear(x, copies[0]), want) else None
                    timings += 1
                    use_lt = lt is not None and lt <= (1.0 - LT_MARGIN) * cublas and not (use and best_us <= lt)
                    plan.choices[(n, k, m)] = GemvChoice(n, k, m, cublas, best_us, best_cfg, use and not use_lt,
                                                         lt, use_lt)
                    if (n, k) in silu_mul_shapes:
                        plan.silu_mul[(n, k, m)] = plan._measure_silu_mul(copies, m, num_sms, margin, calls, replays)
                        timings += 1 + len(candidate_configs(n, k, m, dtype.itemsize, num_sms, act="silu_mul"))
                    if (n, k) in swiglu_shapes:
                        plan.swiglu[(n, k, m)] = plan._measure_swiglu(copies, m, num_sms, margin, calls, replays)
                        timings += 1 + len(candidate_configs(n, k, m, dtype.itemsize, num_sms))
                    if (n, k) == head_shape and dtype in (torch.float16, torch.bfloat16):
                        plan.greedy[m] = plan._measure_greedy(copies, m, margin, calls, replays)
                        timings += 1 + len(GREEDY_CANDIDATES)
                del copies
        torch.cuda.empty_cache()
        plan._one_swiglu_fusion_per_mlp()
        plan.seconds = time.perf_counter() - t0
        logger.info("GEMV plan measured in %.1f s (%d shapes x rows %s, %d timings):\n%s", plan.seconds,
                    len(shapes), ",".join(map(str, ms)), timings, plan.summary())
        return plan

    def _measure_silu_mul(self, copies: list[torch.Tensor], m: int, num_sms: int, margin: float, calls: int,
                          replays: int) -> SiluMulChoice:
        """(N, K, M) of a SwiGLU layer, after its plain choice: ``silu_and_mul`` then that choice, against
        the fused GEMV's candidates on a random (M, 2K) gate/up output."""
        from attnserve.kernels.fused_ops import silu_and_mul
        from attnserve.kernels.triton_gemv import gemv

        n, k = copies[0].shape
        plain = self.choices[(n, k, m)]
        gate_up = torch.randn(m, 2 * k, device=copies[0].device, dtype=copies[0].dtype)
        linear = _chosen(plain) or F.linear
        unfused = lambda w: linear(silu_and_mul(gate_up), w)  # noqa: E731
        unfused_us = time_per_call_us(unfused, copies, calls, replays)
        want = F.linear(silu_and_mul(gate_up), copies[0])
        timed = time_candidates(lambda w, cfg: gemv(gate_up, w, None, cfg, act="silu_mul"), want, copies, n, k, m,
                                 candidate_configs(n, k, m, copies[0].element_size(), num_sms, act="silu_mul"),
                                 calls, replays)
        fused_us, cfg, use = pick_fastest(unfused_us, timed, margin)
        return SiluMulChoice(n, k, m, unfused_us, plain.label(), fused_us, cfg, use)

    def _measure_swiglu(self, copies: list[torch.Tensor], m: int, num_sms: int, margin: float, calls: int,
                        replays: int) -> SiluMulChoice:
        """(2I, K, M) of a gate/up layer, after its plain choice: that choice then ``silu_and_mul``, against the
        GEMV with the SwiGLU epilogue over the layer's candidates (those of >= 2 weight rows a program), on
        random x. A candidate counts only if its plain output agrees with ``F.linear`` and its fused output is
        ``silu_and_mul`` of that plain output bit for bit."""
        from attnserve.kernels.fused_ops import silu_and_mul
        from attnserve.kernels.triton_gemv import gemv

        n, k = copies[0].shape
        plain = self.choices[(n, k, m)]
        x = torch.randn(m, k, device=copies[0].device, dtype=copies[0].dtype)
        linear = _chosen(plain) or F.linear
        unfused_us = time_per_call_us(lambda w: silu_and_mul(linear(x, w)), copies, calls, replays)
        want = F.linear(x, copies[0])
        timed = []
        for cfg in candidate_configs(n, k, m, copies[0].element_size(), num_sms):
            if cfg.block_n < 2:
                continue
            try:
                got = gemv(x, copies[0], None, cfg)
                if not (agrees(got, want) and torch.equal(gemv(x, copies[0], None, cfg, out_act="silu_mul"),
                                                          silu_and_mul(got))):
                    logger.warning("GEMV plan: %s with the SwiGLU epilogue disagrees on (%d, %d) x %d rows; skipped",
                                   cfg.label(), n, k, m)
                    continue
                timed.append((time_per_call_us(lambda w: gemv(x, w, None, cfg, out_act="silu_mul"), copies, calls,
                                               replays), cfg))
            except Exception as e:  # a launch that does not fit this GPU
                logger.debug("GEMV plan: %s failed on (%d, %d) x %d: %s", cfg.label(), n, k, m, e)
        fused_us, cfg, use = pick_fastest(unfused_us, timed, margin)
        return SiluMulChoice(n, k, m, unfused_us, plain.label() + " + silu_and_mul", fused_us, cfg, use)

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

    def _measure_greedy(self, copies: list[torch.Tensor], m: int, margin: float, calls: int,
                        replays: int) -> GreedyChoice:
        """M rows of the LM head (N, K), after its plain choice: that choice then ``triton_argmax``, against the
        fused greedy head's candidates on random hidden states. A candidate counts only if its logits (stored
        once, for this check) agree with ``F.linear`` and its tokens are their argmax."""
        from attnserve.kernels.triton_greedy_head import CANDIDATES as GREEDY_CANDIDATES, greedy_head
        from attnserve.kernels.triton_argmax import argmax

        n, k = copies[0].shape
        plain = self.choices[(n, k, m)]
        head = _chosen(plain) or F.linear
        hidden = torch.randn(m, k, device=copies[0].device, dtype=copies[0].dtype)
        unfused_us = time_per_call_us(lambda w: argmax(head(hidden, w)), copies, calls, replays)
        want = F.linear(hidden, copies[0])
        timed = []
        for cfg in GREEDY_CANDIDATES:
            try:
                logits = torch.empty_like(want)
                tokens = greedy_head(hidden, copies[0], cfg, logits_out=logits)
                if not (agrees(logits, want) and torch.equal(tokens, logits.argmax(dim=-1))):
                    logger.warning("GEMV plan: %s disagrees on (%d, %d) x %d rows; skipped", cfg.label(), n, k, m)
                    continue
                timed.append((time_per_call_us(lambda w: greedy_head(hidden, w, cfg), copies, calls, replays), cfg))
            except Exception as e:  # a launch that does not fit this GPU
                logger.debug("GEMV plan: %s failed on (%d, %d) x %d: %s", cfg.label(), n, k, m, e)
        fused_us, cfg, use = pick_fastest(unfused_us, timed, margin)
        return GreedyChoice(n, k, m, unfused_us, plain.label() + " + argmax", fused_us, cfg, use)

    def summary(self) -> str:
        lines = [f"{'N':>7} {'K':>6} {'M':>2} {'cuBLAS us':>10} {'cuBLASLt us':>11} {'Triton us':>10}  choice"]
        for (n, k, m), c in sorted(self.choices.items()):
            tri = f"{c.triton_us:10.2f}" if c.triton_us is not None else f"{'-':>10}"
            lt = f"{c.cublaslt_us:11.2f}" if c.cublaslt_us is not None else f"{'-':>11}"
            lines.append(f"{n:>7} {k:>6} {m:>2} {c.cublas_us:10.2f} {lt} {tri}  {c.label()}")
        for title, table, unfused in (
                ("SwiGLU layers: silu_and_mul + the choice above vs the fused SwiGLU GEMV", self.silu_mul,
                 "silu_and_mul + {}"),
                ("gate/up layers: the choice above + silu_and_mul vs the SwiGLU in the GEMV's epilogue", self.swiglu,
                 "{}"),
                ("greedy steps: the LM head's choice + argmax vs the fused greedy head",
                 {(c.n, c.k, m): c for m, c in self.greedy.items()}, "{}")):
            if table:
                lines.append(f"{title}\n{'N':>7} {'K':>6} {'M':>2} {'unfused us':>10} {'fused us':>10}  choice")
                for (n, k, m), c in sorted(table.items()):
                    fused = f"{c.fused_us:10.2f}" if c.fused_us is not None else f"{'-':>10}"
                    what = f"fused {c.config.label()}" if c.use_fused and c.config else unfused.format(c.unfused_label)
                    lines.append(f"{n:>7} {k:>6} {m:>2} {c.unfused_us:10.2f} {fused}  {what}")
        return "\n".join(lines)
