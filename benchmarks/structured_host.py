"""Host time of structured outputs per engine step: every request of a batch under one JSON schema, on the CPU.

    PYTHONPATH=. python benchmarks/structured_host.py [--num-requests 64] [--output-len 96] [--vocab-size 151936]
        [--sync] [--json OUT]

Runs ``LLMEngine.step`` (async scheduling on by default, as on a GPU: the path that queues a step's forward
pass, reads the step before, fills the bitmask and then queues the sampling) with a tiny random Qwen3 whose
vocabulary is ``--vocab-size`` (151936: Qwen3-0.6B's, as ``benchmarks/gpu/bench_structured_tpot.py``) and the
default model's tokenizer (SmolLM2, 49152 tokens), on ``--num-requests`` prompts of random tokens, each
generating up to ``--output-len`` tokens (greedy, ``ignore_eos``), once unconstrained and once under
``bench_structured_tpot.SCHEMA``. Each step's parts are timed with ``time.perf_counter`` around the engine's
own methods:

    accept     the grammar matchers advanced by the step's new tokens (StructuredOutputManager)
    fill       the step's token bitmask filled on the host: its start and the wait for it (the fill itself runs in
               the grammar process beside the outputs and the next schedule: StructuredOutputManager.start_bitmask)
    stage      the bitmask to the device (pinned buffer, non-blocking copy; on the CPU no copy is made)
    apply      the bitmask applied to the logits (on the CPU: the CPU's cost, not a GPU's)
    schedule   Scheduler.schedule
    forward    ModelRunner.queue_forward (on the CPU: the model's forward pass itself; on a GPU: its launch)
    ahead      ModelRunner.prepare_ahead: the host batch of a step planned ahead (structured steps; otherwise that
               work is in forward)
    sample     ModelRunner's sampling stage (LM head, logits processors, stage + apply, Sampler)
    head       the fused greedy head's launch, within sample (GreedyHead.run; 0 where it does not apply)
    wait       the wait for a step's sampled tokens (PendingStep.result; on a GPU: for the device)
    update     Scheduler.update;  output  OutputProcessor.process (detokenization off)
    step       the whole LLMEngine.step

Reported over the steps in which every request decodes (medians, ms). ``grammar_host`` = accept + fill +
stage: the host work a GPU step must hide (apply runs on the device there). ``extra`` = the constrained
step's median minus the unconstrained one's.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time

import torch

from benchmarks.host_overhead import Timer, write_qwen3

PARTS = (
    "accept",
    "fill",
    "fill_start",
    "fill_wait",
    "stage",
    "apply",
    "schedule",
    "ahead",
    "forward",
    "sample",
    "head",
    "wait",
    "update",
    "output",
    "step",
)


class StepParts:
    """Times the parts of each ``LLMEngine.step`` of an in-process engine (its methods wrapped in place) and
    keeps those of the steps that decode one token for each of ``num_requests`` requests."""

    def __init__(self, engine, num_requests: int, timer: Timer | None = None) -> None:
        import attnserve.model_executor.step_output as mr
        from attnserve.structured_output.bitmask import GrammarBitmask
        from attnserve.structured_output.manager import PendingBitmask

        self.num_requests = num_requests
        self.steps: list[dict[str, float]] = []
        # every step's parts (s) with "requests": its plan's request count, "decode": whether all decode
        self.trace: list[dict[str, float]] = []
        self.timer = timer = timer if timer is not None else Timer()
        runner = engine.runner
        timer.wrap(engine.scheduler, "schedule", "schedule")
        schedule = engine.scheduler.schedule
        self.plan = None

        def keep(*args, **kwargs):
            plan = schedule(*args, **kwargs)
            if self.plan is None:  # a step's first: a structured step then plans the step after it ahead
                self.plan = plan
            return plan

        timer.replace(engine.scheduler, "schedule", keep)
        timer.wrap(engine.scheduler, "update", "update")
        timer.wrap(engine.output_processor, "process", "output")
        timer.wrap(runner, "queue_forward", "forward")
        timer.wrap(runner, "prepare_ahead", "ahead")
        timer.wrap(runner.greedy_head, "run", "head")
        timer.wrap(mr.QueuedForward, "sample", "sample")
        timer.wrap(engine.structured, "start_bitmask", "fill")  # the fill's start, then the wait for it
        timer.wrap(PendingBitmask, "result", "fill")
        timer.wrap(engine.structured, "start_bitmask", "fill_start")  # the same two apart
        timer.wrap(PendingBitmask, "result", "fill_wait")
        timer.wrap(engine.structured, "accept_tokens", "accept")
        timer.wrap(mr, "apply_grammar_bitmask", "apply")  # as step_output's own code calls it
        timer.wrap(mr.PendingStep, "result", "wait")
        timer.wrap(GrammarBitmask, "to", "stage")  # the bitmask record's copy to the device
        step = engine.step

        def timed_step():
            timer.now.clear()
            self.plan = None
            t = time.perf_counter()
            try:
                return step()
            finally:
                timer.now["step"] = time.perf_counter() - t
                plan = self.plan  # the first plan this call made: every request decoding one token
                decode = plan is not None and all(len(r.token_ids) == 1 for r in plan.requests)
                n = 0 if plan is None else len(plan.requests)
                self.trace.append({**timer.now, "requests": n, "decode": decode, "t": time.perf_counter()})
                if decode and n == self.num_requests:
                    self.steps.append(dict(timer.now))

        timer.replace(engine, "step", timed_step)

    def detach(self) -> None:
        """Unwrap the engine's methods: its steps run untimed again (the timing costs a few us a wrapped call)."""
        self.timer.unwrap()

    def medians(self) -> dict[str, float]:
        """Each part's median over the kept steps, ms; ``grammar_host`` = accept + fill + stage."""
        if not self.steps:
            raise SystemExit("no step in which every request decodes: raise the output length")
        med = {k: 1e3 * statistics.median(s.get(k, 0.0) for s in self.steps) for k in PARTS}
        med["grammar_host"] = med["accept"] + med["fill"] + med["stage"]
        return med

    def tails(self, parts: tuple[str, ...] = ("step", "fill", "sample", "output")) -> dict[str, dict[str, float]]:
        """Per part, over the kept steps (ms): mean, p90, p99 and max. A TPOT is a mean step: steps far above the
        median (a slow fill, a long pause) show here, not in :meth:`medians`."""
        return {k: tail_stats([1e3 * s.get(k, 0.0) for s in self.steps]) for k in parts if self.steps}


def tail_stats(values: list[float]) -> dict[str, float]:
    """mean, p90, p99 (the value at rank int(q n) of the sorted values) and max of a non-empty list."""
    xs = sorted(values)
    rank = lambda q: xs[min(len(xs) - 1, int(q * len(xs)))]  # noqa: E731
    return {"mean": statistics.fmean(xs), "p90": rank(0.9), "p99": rank(0.99), "max": xs[-1]}


class GcPauses:
    """Python's garbage collections while it is active (a context manager): count and time per generation."""

    def __init__(self) -> None:
        self.by_generation: dict[int, list[float]] = {}
        self._start = 0.0

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.by_generation.setdefault(info["generation"], []).append(time.perf_counter() - self._start)

    def __enter__(self) -> GcPauses:
        import gc

        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc) -> None:
        import gc

        gc.callbacks.remove(self._callback)

    def summary(self) -> dict[str, dict[str, float]]:
        """Per generation: collections and their total and longest time (ms)."""
        return {
            f"gen{g}": {"count": len(ts), "total_ms": 1e3 * sum(ts), "max_ms": 1e3 * max(ts)}
            for g, ts in sorted(self.by_generation.items())
        }


def run(engine, prompts, params, parts: StepParts) -> dict:
    from attnserve import SamplingParams

    engine.add_request(
        [1, 2, 3],
        SamplingParams(
            temperature=0.0,
            max_tokens=4,
            ignore_eos=True,
            detokenize=False,
            structured_outputs=params.structured_outputs,
        ),
    )  # warm-up
    while engine.has_unfinished_requests():
        engine.step()
    for p in prompts:
        engine.add_request(p, params)
    parts.steps.clear()
    tokens = 0
    while engine.has_unfinished_requests():
        tokens += sum(len(o.outputs[0].token_ids) for o in engine.step() if o.finished)
    return {"median_ms": parts.medians(), "decode_steps": len(parts.steps), "tokens_mean": tokens / len(prompts)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=96)
    ap.add_argument("--vocab-size", type=int, default=151936)
    ap.add_argument("--sync", action="store_true", help="async scheduling off")
    ap.add_argument("--json", default=None, help="write the results here")
    a = ap.parse_args()
    torch.set_num_threads(1)

    from attnserve import LLM, SamplingParams
    from attnserve.core.structured_outputs import StructuredOutputsParams
    from attnserve.model_executor.loader import default_model_path
    from benchmarks.gpu.bench_structured_tpot import SCHEMA

    torch.manual_seed(0)
    model = write_qwen3(
        tempfile.mkdtemp(prefix="structured_host_"), "tiny", a.vocab_size, a.input_len + a.output_len + 16
    )
    llm = LLM(
        model,
        tokenizer=default_model_path(),
        load_format="dummy",
        device="cpu",
        dtype="float32",
        attention_backend="CPU_ATTN",
        kv_cache_memory=256 << 20,
        max_num_seqs=a.num_requests,
        async_scheduling=not a.sync,
    )
    engine = llm.engine
    parts = StepParts(engine, a.num_requests)
    rng = random.Random(0)
    vocab = min(a.vocab_size, len(llm.tokenizer))
    prompts = [[rng.randrange(100, vocab) for _ in range(a.input_len)] for _ in range(a.num_requests)]
    free = SamplingParams(temperature=0.0, max_tokens=a.output_len, ignore_eos=True, detokenize=False)
    constrained = SamplingParams(
        temperature=0.0,
        max_tokens=a.output_len,
        ignore_eos=True,
        detokenize=False,
        structured_outputs=StructuredOutputsParams(json=SCHEMA),
    )
    results = {
        name: run(engine, prompts, params, parts)
        for name, params in (("unconstrained", free), ("json_schema", constrained))
    }
    results["extra_ms"] = results["json_schema"]["median_ms"]["step"] - results["unconstrained"]["median_ms"]["step"]
    print(
        f"{a.num_requests} requests, vocab {a.vocab_size} (tokenizer {len(llm.tokenizer)}), "
        f"{'sync' if a.sync else 'async'} scheduling, CPU; ms per all-decode step (median)"
    )
    print(
        f"  {'':<13}"
        + "".join(f"{p:>{max(9, len(p) + 1)}}" for p in PARTS + ("grammar_host",))
        + f"{'steps':>7}{'tokens':>8}"
    )
    for name in ("unconstrained", "json_schema"):
        r = results[name]
        print(
            f"  {name:<13}"
            + "".join(f"{r['median_ms'][p]:{max(9, len(p) + 1)}.3f}" for p in PARTS + ("grammar_host",))
            + f"{r['decode_steps']:7d}{r['tokens_mean']:8.1f}"
        )
    print(f"  step extra under the schema: {results['extra_ms']:.3f} ms")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), **results}, f, indent=1)
    engine.shutdown()


if __name__ == "__main__":
    main()
