"""Does a step's grammar work overlap the engine's Python? The accept + bitmask fill of 64 matchers
(``bench_structured_tpot.SCHEMA``, the default tokenizer) beside a fixed amount of busy Python work (``--python-us``
microseconds when it runs alone), done three ways: one after the other (``serial``), in a thread of this process
(``thread``, at the default GIL switch interval and at 0.1 ms) and in the grammar process (``process``:
``structured_output/grammar_process.py``, what the engine does).

    PYTHONPATH=. python benchmarks/grammar_overlap.py [--python-us 1500] [--steps 40] [--tokenizer DIR] [--json OUT]

Prints per mode the median time per step, the Python work's own time beside the grammar work, and the wait for
the grammar work after it (ms). Without overlap a step takes the job plus the work; with full overlap, the work
alone, at its speed alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from benchmarks.gpu.bench_structured_tpot import SCHEMA


def calibrate(us: float) -> int:
    """Iterations of :func:`busy` that take ``us`` microseconds alone."""
    n = 1000
    while True:
        t = time.perf_counter()
        busy(n)
        took = time.perf_counter() - t
        if took > 0.01:
            return int(n * us * 1e-6 / took)
        n *= 4


def busy(n: int) -> int:
    x = 0
    for i in range(n):
        x += i
    return x


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--python-us", type=float, default=1500.0)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--tokenizer", default=None, help="a tokenizer folder (default: the default model's)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    import xgrammar as xgr

    from attnserve.model_executor.loader import load_tokenizer, resolve_model_source
    from attnserve.structured_output.backend_xgrammar import batch_accept
    from attnserve.structured_output.grammar_process import GrammarProcess

    if a.tokenizer is not None:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(a.tokenizer)
    else:
        tok = load_tokenizer(resolve_model_source(None))
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok))
    compiled = xgr.GrammarCompiler(info).compile_json_schema(json.dumps(SCHEMA))
    batch = xgr.BatchGrammarMatcher(max_threads=1)
    width = (len(tok) + 31) // 32
    words = np.zeros((64, width), dtype=np.int32)

    # the token sequence: each step, an allowed token of each row
    matchers, steps = [xgr.GrammarMatcher(compiled) for _ in range(64)], []
    for _ in range(a.steps):
        batch.batch_fill_next_token_bitmask(matchers, words)
        tokens = []
        for row in words:
            bits = np.flatnonzero(np.unpackbits(row.view(np.uint8), bitorder="little"))
            tokens.append(int(bits[len(bits) // 2]))
        batch_accept(xgr, matchers, tokens, frozenset())
        steps.append(tokens)

    iterations = calibrate(a.python_us)
    pool = ThreadPoolExecutor(1)
    process = GrammarProcess(info.serialize_json(), 64, width)
    process.grammar(0, compiled)

    def run(mode: str, interval: float | None = None) -> dict:
        ms = [xgr.GrammarMatcher(compiled) for _ in range(64)]
        for slot in range(64):
            process.add(slot, 0)
        totals, works, waits = [], [], []
        old = sys.getswitchinterval()
        if interval is not None:
            sys.setswitchinterval(interval)

        def job(tokens):
            batch_accept(xgr, ms, tokens, frozenset())
            batch.batch_fill_next_token_bitmask(ms, words)

        try:
            for tokens in steps:
                t = time.perf_counter()
                if mode == "thread":
                    f = pool.submit(job, tokens)
                elif mode == "process":
                    process.start_fill(list(range(64)), tokens, list(range(64)), 0)
                else:
                    job(tokens)
                t1 = time.perf_counter()
                busy(iterations)
                t2 = time.perf_counter()
                if mode == "thread":
                    f.result()
                elif mode == "process":
                    process.wait()
                t3 = time.perf_counter()
                totals.append(t3 - t)
                works.append(t2 - t1)
                waits.append(t3 - t2)
        finally:
            sys.setswitchinterval(old)
        ms_ = lambda xs: round(1e3 * statistics.median(xs), 3)  # noqa: E731
        return {
            "mode": mode,
            "interval_ms": None if interval is None else interval * 1e3,
            "step": ms_(totals),
            "work": ms_(works),
            "wait": ms_(waits),
        }

    rows = [run("serial"), run("thread"), run("thread", 1e-4), run("process")]
    process.close()
    print(f"python work {a.python_us / 1e3:.3f} ms alone; ms per step (median)")
    print(f"{'mode':<8} {'interval':>9} {'step':>7} {'work':>7} {'wait':>7}")
    for r in rows:
        label = "default" if r["interval_ms"] is None else f"{r['interval_ms']:g} ms"
        print(f"{r['mode']:<8} {label:>9} {r['step']:7.3f} {r['work']:7.3f} {r['wait']:7.3f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"python_us": a.python_us, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
