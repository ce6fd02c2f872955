"""TPOT of a batch under one JSON schema against the same batch unconstrained (dummy weights: the tokens are
noise, but the schema still constrains them, and every step fills and applies a bitmask for every row).

    python -m benchmarks.gpu.bench_structured_tpot [--model benchmarks/shapes/qwen3-0.6b] [--batch 64]
        [--input-len 128] [--output-len 256] [--rounds 5] [--json OUT] [--no-host-parts] [--variants ...]
        [ENGINE FLAGS as LLM keyword=value, e.g. use_skinny_gemm=true]

The shapes carry no tokenizer: ``$ATTNSERVE_TEST_TOKENIZER`` (``stage.sh tok``: /tmp/tok) or ``tokenizer=DIR``.

Every request is ``--input-len`` random prompt tokens and runs exactly ``--output-len`` tokens (ignore_eos; the
schema's long string field keeps a constrained request from ending sooner), greedy. TPOT per request is
(finish - first token) / (tokens - 1), the median over the batch. Each mode runs once to warm up (compile, CUDA
graphs, the grammar), then ``--rounds`` rounds of one timed run of each mode back to back, each round's order
starting one mode later than the last's: the table gives each mode's median over the rounds, and the JSON cost
is the median of the rounds' own ratios (the host's speed drifts within a process, so only neighbours compare).
The rounds run without part timers (they cost a few us a wrapped call). Then one more run of each mode gives the
host's time per all-decode step by part (``benchmarks/structured_host.py``'s ``StepParts``: grammar accept,
bitmask fill and copy, schedule, the launches of the forward pass and of the sampling, the wait for the device's
tokens, ...; medians, ms), the tails of the
step and of its slow parts (mean, p90, p99, max: a TPOT is a mean step) and the timed run's garbage
collections. ``--variants``: more JSON modes per round, each the engine's path with one change (``VARIANTS``).
Each constrained output the grammar ended (finish reason stop) is checked against the schema (``jsonschema``,
where installed): "valid" is how many of those parse and validate.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np

from attnserve import LLM, SamplingParams
from attnserve.core.structured_outputs import StructuredOutputsParams

SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 1000000},
        "kind": {"enum": ["order", "refund", "query"]},
        "customer": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "vip": {"type": "boolean"}},
            "required": ["name", "vip"],
        },
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1, "maximum": 99}},
                "required": ["sku", "qty"],
            },
        },
        "note": {"type": "string"},
    },
    "required": ["id", "kind", "customer", "items", "note"],
}


def _accept_on_engine_thread(structured):
    """Every token accepted at once, each step's accepts a round trip of their own (none deferred to the fill)."""
    timed = structured.accept_tokens
    structured.accept_tokens = lambda tokens, defer=False: timed(tokens, False)
    return lambda: setattr(structured, "accept_tokens", timed)


# name -> patch(engine.structured) returning its undo: the JSON path with one change, for --variants
VARIANTS = {
    "json_accept_main": _accept_on_engine_thread,
}


def _value(v: str):
    try:
        return json.loads(v)
    except json.JSONDecodeError:
        return v


def _validates(text: str) -> bool:
    """Whether ``text`` parses as JSON and (where jsonschema is installed) validates against SCHEMA; a request
    cut by max_tokens inside a value does not parse."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return False
    try:
        import jsonschema
    except ImportError:
        return True
    try:
        jsonschema.validate(value, SCHEMA)
    except jsonschema.ValidationError:
        return False
    return True


def run(llm: LLM, prompts: list[list[int]], params: SamplingParams, parts=None) -> dict:
    from benchmarks.structured_host import GcPauses

    if parts is not None:
        parts.steps.clear()
        parts.trace.clear()
    with GcPauses() as gc_pauses:
        t0 = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        wall = time.perf_counter() - t0
    tpots, ntok = [], []
    for o in outs:
        m, n = o.metrics, len(o.outputs[0].token_ids)
        ntok.append(n)
        if n > 1:
            tpots.append((m.finished_time - m.first_token_time) / (n - 1))
    valid = None
    if params.structured_outputs is not None:  # of the outputs the grammar ended (the others hit max_tokens)
        ended = [o.outputs[0].text for o in outs if o.outputs[0].finish_reason == "stop"]
        valid = (sum(_validates(t) for t in ended), len(ended))
    out = {
        "valid_json": valid,
        "tpot_ms": 1e3 * statistics.median(tpots),
        "tokens_mean": statistics.mean(ntok),
        "output_tok_s": sum(ntok) / wall,
        "wall_s": wall,
        "gc": gc_pauses.summary(),
        "requests": [
            (
                len(o.outputs[0].token_ids),
                o.metrics.first_token_time,
                o.metrics.finished_time,
                o.outputs[0].finish_reason,
            )
            for o in outs
        ],
    }
    if parts is not None and parts.steps:
        out["host_ms"] = parts.medians()
        out["host_tails_ms"] = parts.tails()
        out["decode_steps"] = len(parts.steps)
        out["trace"] = list(parts.trace)
    return out


def workload(a: argparse.Namespace) -> tuple[dict, LLM, list[list[int]], SamplingParams, SamplingParams]:
    """The engine (dummy weights, ``a.engine``'s keyword=value flags over the defaults) and the batch: its LLM
    keywords, the LLM, ``a.batch`` random prompts of ``a.input_len`` tokens, and the unconstrained and JSON-schema
    sampling params (greedy, ``a.output_len`` tokens, ignore_eos)."""
    kw = dict(
        load_format="dummy", dtype="bfloat16", max_num_seqs=a.batch, max_model_len=a.input_len + a.output_len + 16
    )
    if os.environ.get("ATTNSERVE_TEST_TOKENIZER"):  # the staged tokenizer (the shapes have none of their own)
        kw["tokenizer"] = os.environ["ATTNSERVE_TEST_TOKENIZER"]
    kw.update({k: _value(v) for k, v in (e.split("=", 1) for e in a.engine)})
    llm = LLM(a.model, **kw)
    rng = np.random.default_rng(0)
    prompts = rng.integers(100, 10000, (a.batch, a.input_len)).tolist()
    free = SamplingParams(temperature=0.0, max_tokens=a.output_len, ignore_eos=True)
    constrained = SamplingParams(
        temperature=0.0,
        max_tokens=a.output_len,
        ignore_eos=True,
        structured_outputs=StructuredOutputsParams(json=SCHEMA),
    )
    return kw, llm, prompts, free, constrained


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="benchmarks/shapes/qwen3-0.6b")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--no-host-parts", action="store_true", help="do not time the host's parts of each step")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds, one run of each mode apiece")
    ap.add_argument(
        "--variants",
        nargs="*",
        default=[],
        choices=sorted(VARIANTS),
        help="more JSON modes per round, each the engine's path with one change (VARIANTS)",
    )
    ap.add_argument("engine", nargs="*", help="LLM keyword=value")
    a = ap.parse_args()
    kw, llm, prompts, free, constrained = workload(a)
    modes = (("unconstrained", free), ("json_schema", constrained)) + tuple((v, constrained) for v in a.variants)
    structured = llm.engine.structured

    def run_mode(name: str, params: SamplingParams, parts=None) -> dict:
        if name not in VARIANTS:
            return run(llm, prompts, params, parts)
        undo = VARIANTS[name](structured)
        try:
            return run(llm, prompts, params, parts)
        finally:
            undo()

    for name, params in modes:
        run_mode(name, params)  # warm-up: compile, CUDA graphs, the grammar
    # rounds of one timed run per mode, back to back: the host's speed drifts within a process (the H200 machine:
    # 2.05 -> 2.45 ms for the same unconstrained run minutes apart), so each round's ratio compares neighbours
    rounds = []
    for i in range(a.rounds):  # untimed by parts: their wrappers cost a few us a call, more calls in a JSON step
        turn = modes[i % len(modes) :] + modes[: i % len(modes)]  # each round starts one mode later: no mode always
        rounds.append({name: run_mode(name, params) for name, params in turn})  # runs just after another
    timed = {}
    if not a.no_host_parts:  # then one run per mode with its parts timed: the table of parts and tails
        from benchmarks.structured_host import StepParts

        parts = StepParts(llm.engine, a.batch)
        timed = {name: run_mode(name, params, parts) for name, params in modes}
        parts.detach()
    ratios = [r["json_schema"]["tpot_ms"] / r["unconstrained"]["tpot_ms"] for r in rounds]
    variant_cost = {
        v: statistics.median(r[v]["tpot_ms"] / r["unconstrained"]["tpot_ms"] for r in rounds) - 1 for v in a.variants
    }
    results = {name: dict(rounds[-1][name]) for name, _ in modes}  # the last round's, parts from their run
    for name, _ in modes:
        per_round = [r[name]["tpot_ms"] for r in rounds]
        results[name]["tpot_ms"] = statistics.median(per_round)
        results[name]["tpot_ms_rounds"] = per_round
        for k in ("host_ms", "host_tails_ms", "decode_steps", "trace"):
            if k in timed.get(name, {}):
                results[name][k] = timed[name][k]
        if name in timed:
            results[name]["tpot_ms_parts_timed"] = timed[name]["tpot_ms"]
    base = results["unconstrained"]["tpot_ms"]
    cost = statistics.median(ratios) - 1
    print(f"engine: {kw}")
    print(f"{'mode':<14} {'TPOT ms':>8} {'vs free':>8} {'tokens':>7} {'out tok/s':>10} {'valid':>6}")
    for name, r in results.items():
        valid = "-" if r["valid_json"] is None else "{}/{}".format(*r["valid_json"])
        print(
            f"{name:<14} {r['tpot_ms']:>8.3f} {r['tpot_ms'] / base - 1:>+8.1%} {r['tokens_mean']:>7.1f} "
            f"{r['output_tok_s']:>10.0f} {valid:>6}"
        )
    rounds_text = ", ".join(
        "/".join(f"{t:.3f}" for t in ts) for ts in zip(*(results[n]["tpot_ms_rounds"] for n, _ in modes))
    )
    names = "/".join(n for n, _ in modes)
    print(f"rounds ({names} TPOT ms): {rounds_text}; JSON cost, median of the rounds' ratios: {cost:+.1%}")
    for v, c in variant_cost.items():
        print(f"JSON cost of {v}, median of the rounds' ratios: {c:+.1%}")
    if timed:
        text = ", ".join(f"{n} {r['tpot_ms']:.3f}" for n, r in timed.items())
        print(f"TPOT ms of the run with its parts timed: {text}")
    if timed and all("host_ms" in r for r in results.values()):
        from benchmarks.structured_host import PARTS

        names = [p for p in PARTS if p != "apply"] + ["grammar_host"]
        print("host per all-decode step, ms (median):")
        print(f"{'mode':<14}" + "".join(f"{p:>{max(9, len(p) + 1)}}" for p in names))
        for name, r in results.items():
            print(f"{name:<14}" + "".join(f"{r['host_ms'][p]:{max(9, len(p) + 1)}.3f}" for p in names))
        print("host step tails, ms (mean / p90 / p99 / max), and the timed run's garbage collections:")
        for name, r in results.items():
            tails = "  ".join(
                f"{k} {t['mean']:.3f}/{t['p90']:.3f}/{t['p99']:.3f}/{t['max']:.3f}"
                for k, t in r["host_tails_ms"].items()
            )
            gcs = ", ".join(f"{g} {v['count']} ({v['total_ms']:.1f} ms)" for g, v in r["gc"].items()) or "none"
            print(f"{name:<14} {tails}  gc: {gcs}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(
                {
                    "engine": {k: str(v) for k, v in kw.items()},
                    "batch": a.batch,
                    "results": results,
                    "json_cost_median_of_rounds": cost,
                    "variant_cost_median_of_rounds": variant_cost,
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
