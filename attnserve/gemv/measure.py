"""GemvPlan's start-up measurement: time cuBLAS, cuBLASLt and the Triton candidates for every layer shape and
decode row count of a model, and keep what wins (``choices.pick_fastest``).

For every distinct weight shape (N, K) of the model's linear layers and LM head, and each decode batch
size M of the CUDA-graph buckets up to ``MAX_ROWS`` = 64 that the engine captures (by default 1, 2, 4, 8,
16, 32, 48, 64; ``choices.plan_rows`` of ``cuda_graph.capture_sizes(max_num_seqs)``), the plan times
``F.linear`` (cuBLAS) and at most 6 Triton launch configurations (``tiles.candidate_configs``), and keeps
Triton only where its best one is faster by ``margin`` (5%) and agrees with ``F.linear``; it also times
``F.linear`` through cuBLASLt (``blas.cublaslt_linear``) and takes it where it beats cuBLAS by ``LT_MARGIN``
(2%) and Triton is not faster still. Batch 16..64 is measured too: there cuBLAS's GEMMs are still
latency-bound (see ``triton_gemv``); the LM head at 64 rows is a large GEMM where cuBLAS likely stays, and the plan decides.

Start-up cost: per (N, K, M) one cuBLAS timing and up to 6 Triton ones (each a CUDA graph of >= 20 calls,
replayed 11 times), plus one Triton compile per distinct launch (tile, stages, warps, padded rows, split or
not, K tail or not; not the row count itself). For the Llama-3.1-8B and Qwen3-0.6B shapes with rows
1..64: ~310-320 timings (most of the time the LM head's) and ~60-70 distinct kernels to compile (Triton
caches them on disk for the next start), about twice the work of rows 1..8. ``measure_plan`` logs its time
and counts.

Timing imitates a decode step inside a CUDA graph (``timing.py``: one graph of back-to-back calls
cycling through copies of the weight whose total exceeds twice the L2 cache); the launch configurations
tried are ``tiles.py``'s. Triton is imported when a plan is measured, never by importing this module.
"""

from __future__ import annotations

import logging
import time

import torch
import torch.nn.functional as F
from torch import nn

from attnserve.gemv import choices
from attnserve.gemv.blas import cublaslt_linear
from attnserve.gemv.choices import GemvChoice, GreedyChoice, SiluMulChoice, chosen_gemv, pick_fastest, plan_rows
from attnserve.gemv.plan import GemvPlan, gemv_layers, plan_shapes
from attnserve.gemv.tiles import candidate_configs
from attnserve.gemv.timing import agrees, l2_bytes, time_candidates, time_per_call_us, weight_copies

logger = logging.getLogger("attnserve.gemv")


def measure_plan(
    model: nn.Module, ms: tuple[int, ...] | None = None, margin: float | None = None, calls: int = 20, replays: int = 10
) -> GemvPlan:
    """Time cuBLAS and ``candidate_configs`` for each distinct layer shape and row count in ``ms``
    (default ``DECODE_MS``; pass ``plan_rows`` of the engine's CUDA-graph sizes; counts past
    ``MAX_ROWS`` are dropped); Triton is used where its best time is at most ``1 - margin`` (default
    ``choices.MARGIN``) of cuBLAS's. For the SwiGLU MLPs' shapes, then time ``silu_and_mul`` + that choice
    against the fused candidates (:func:`_measure_silu_mul`, :func:`_measure_swiglu`), with the same margin.
    Logs the seconds taken and the number of timings."""
    margin = choices.MARGIN if margin is None else margin
    ms = plan_rows(ms)
    from attnserve.kernels.triton_gemv import gemv, prepare
    from attnserve.kernels.triton_greedy_head import CANDIDATES as GREEDY_CANDIDATES

    t0 = time.perf_counter()
    plan = GemvPlan()
    kinds = plan_shapes(model)
    shapes = [(n, k) for kind, n, k in kinds if kind == "linear"]
    weights = {tuple(w.shape): w for _, w in gemv_layers(model)}
    silu_mul_shapes = {(n, k) for kind, n, k in kinds if kind == "down"}
    swiglu_shapes = {(n, k) for kind, n, k in kinds if kind == "gate_up"}
    head_shape = next(((n, k) for kind, n, k in kinds if kind == "greedy"), None)  # unsharded, 16-bit
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
                timed = time_candidates(
                    lambda w, cfg: gemv(x, w, None, cfg), want, copies, n, k, m, cands, calls, replays
                )
                timings += 1 + len(cands)
                best_us, best_cfg, use = pick_fastest(cublas, timed, margin)
                lt = (
                    time_per_call_us(lambda w: cublaslt_linear(x, w), copies, calls, replays)
                    if agrees(cublaslt_linear(x, copies[0]), want)
                    else None
                )
                timings += 1
                use_lt = lt is not None and lt <= (1.0 - choices.LT_MARGIN) * cublas and not (use and best_us <= lt)
                plan.choices[(n, k, m)] = GemvChoice(n, k, m, cublas, best_us, best_cfg, use and not use_lt, lt, use_lt)
                if (n, k) in silu_mul_shapes:
                    plan.silu_mul[(n, k, m)] = _measure_silu_mul(plan, copies, m, num_sms, margin, calls, replays)
                    timings += 1 + len(candidate_configs(n, k, m, dtype.itemsize, num_sms, act="silu_mul"))
                if (n, k) in swiglu_shapes:
                    plan.swiglu[(n, k, m)] = _measure_swiglu(plan, copies, m, num_sms, margin, calls, replays)
                    timings += 1 + len(candidate_configs(n, k, m, dtype.itemsize, num_sms))
                if (n, k) == head_shape:
                    plan.greedy[m] = _measure_greedy(plan, copies, m, margin, calls, replays)
                    timings += 1 + len(GREEDY_CANDIDATES)
            del copies
    torch.cuda.empty_cache()
    plan._one_swiglu_fusion_per_mlp()
    plan.seconds = time.perf_counter() - t0
    logger.info(
        "GEMV plan timings: %d shapes x rows %s, %d timings in %.1f s:\n%s",
        len(shapes),
        ",".join(map(str, ms)),
        timings,
        plan.seconds,
        plan.summary(),
    )
    return plan


def _measure_silu_mul(
    plan: GemvPlan, copies: list[torch.Tensor], m: int, num_sms: int, margin: float, calls: int, replays: int
) -> SiluMulChoice:
    """(N, K, M) of a SwiGLU layer, after its plain choice: ``silu_and_mul`` then that choice, against
    the fused GEMV's candidates on a random (M, 2K) gate/up output."""
    from attnserve.kernels.fused_ops import silu_and_mul
    from attnserve.kernels.triton_gemv import gemv

    n, k = copies[0].shape
    plain = plan.choices[(n, k, m)]
    gate_up = torch.randn(m, 2 * k, device=copies[0].device, dtype=copies[0].dtype)
    linear = chosen_gemv(plain) or F.linear
    unfused = lambda w: linear(silu_and_mul(gate_up), w)  # noqa: E731
    unfused_us = time_per_call_us(unfused, copies, calls, replays)
    want = F.linear(silu_and_mul(gate_up), copies[0])
    timed = time_candidates(
        lambda w, cfg: gemv(gate_up, w, None, cfg, act="silu_mul"),
        want,
        copies,
        n,
        k,
        m,
        candidate_configs(n, k, m, copies[0].element_size(), num_sms, act="silu_mul"),
        calls,
        replays,
    )
    fused_us, cfg, use = pick_fastest(unfused_us, timed, margin)
    return SiluMulChoice(n, k, m, unfused_us, plain.label(), fused_us, cfg, use)


def _measure_swiglu(
    plan: GemvPlan, copies: list[torch.Tensor], m: int, num_sms: int, margin: float, calls: int, replays: int
) -> SiluMulChoice:
    """(2I, K, M) of a gate/up layer, after its plain choice: that choice then ``silu_and_mul``, against the
    GEMV with the SwiGLU epilogue over the layer's candidates (those of >= 2 weight rows a program), on
    random x. A candidate counts only if its plain output agrees with ``F.linear`` and its fused output is
    ``silu_and_mul`` of that plain output bit for bit."""
    from attnserve.kernels.fused_ops import silu_and_mul
    from attnserve.kernels.triton_gemv import gemv

    n, k = copies[0].shape
    plain = plan.choices[(n, k, m)]
    x = torch.randn(m, k, device=copies[0].device, dtype=copies[0].dtype)
    linear = chosen_gemv(plain) or F.linear
    unfused_us = time_per_call_us(lambda w: silu_and_mul(linear(x, w)), copies, calls, replays)
    want = F.linear(x, copies[0])
    timed = []
    for cfg in candidate_configs(n, k, m, copies[0].element_size(), num_sms):
        if cfg.block_n < 2:
            continue
        try:
            got = gemv(x, copies[0], None, cfg)
            if not (
                agrees(got, want) and torch.equal(gemv(x, copies[0], None, cfg, out_act="silu_mul"), silu_and_mul(got))
            ):
                logger.warning(
                    "GEMV plan: %s with the SwiGLU epilogue disagrees on (%d, %d) x %d rows; skipped",
                    cfg.label(),
                    n,
                    k,
                    m,
                )
                continue
            timed.append(
                (time_per_call_us(lambda w: gemv(x, w, None, cfg, out_act="silu_mul"), copies, calls, replays), cfg)
            )
        except Exception as e:  # a launch that does not fit this GPU
            logger.debug("GEMV plan: %s failed on (%d, %d) x %d: %s", cfg.label(), n, k, m, e)
    fused_us, cfg, use = pick_fastest(unfused_us, timed, margin)
    return SiluMulChoice(n, k, m, unfused_us, plain.label() + " + silu_and_mul", fused_us, cfg, use)


def _measure_greedy(
    plan: GemvPlan, copies: list[torch.Tensor], m: int, margin: float, calls: int, replays: int
) -> GreedyChoice:
    """M rows of the LM head (N, K), after its plain choice: that choice then ``triton_argmax``, against the
    fused greedy head's candidates on random hidden states. A candidate counts only if its logits (stored
    once, for this check) agree with ``F.linear`` and its tokens are their argmax."""
    from attnserve.kernels.triton_greedy_head import CANDIDATES as GREEDY_CANDIDATES, greedy_head
    from attnserve.kernels.triton_argmax import argmax

    n, k = copies[0].shape
    plain = plan.choices[(n, k, m)]
    head = chosen_gemv(plain) or F.linear
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
