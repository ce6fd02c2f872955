"""Does the grammar worker thread overlap the engine's Python? A step's accept + bitmask fill of 64 matchers
(``bench_structured_tpot.SCHEMA``, the default tokenizer) in a worker thread beside a busy Python loop of
``--python-us`` microseconds, at several GIL switch intervals, against the same work one after the other.

    PYTHONPATH=. python benchmarks/grammar_overlap.py [--python-us 1500] [--fill-threads 1 8] [--steps 40] [--tokenizer DIR]

Prints, per fill thread count and switch interval, the median time per step, the job's own time and the main
thread's wait for the worker (ms). Without overlap a step takes the job plus the loop; with full overlap, the
loop alone. (``StructuredOutputManager``
lowers the interval to ``FILL_SWITCH_INTERVAL`` while its fill runs.)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from benchmarks.gpu.bench_structured_tpot import SCHEMA


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--python-us", type=float, default=1500.0)
    ap.add_argument("--fill-threads", type=int, nargs="+", default=[1])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--tokenizer", default=None, help="a tokenizer folder (default: the default model's)")
    a = ap.parse_args()
    import xgrammar as xgr

    from attnserve.model_executor.loader import load_tokenizer, resolve_model_source

    if a.tokenizer is not None:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(a.tokenizer)
    else:
        tok = load_tokenizer(resolve_model_source(None))
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok))
    compiled = xgr.GrammarCompiler(info).compile_json_schema(json.dumps(SCHEMA))
    batch = xgr.BatchGrammarMatcher(max_threads=a.fill_threads[0])
    words = torch.zeros((64, (len(tok) + 31) // 32), dtype=torch.int32)

    jobs: list[float] = []

    def job(matchers, tokens):
        t = time.perf_counter()
        xgr.BatchGrammarMatcher.batch_accept_token(matchers, tokens)
        batch.batch_fill_next_token_bitmask(matchers, words)
        jobs.append(time.perf_counter() - t)

    # the token sequence: each step, an allowed token of each row
    matchers, steps = [xgr.GrammarMatcher(compiled) for _ in range(64)], []
    for _ in range(a.steps):
        batch.batch_fill_next_token_bitmask(matchers, words)
        tokens = []
        for row in words.numpy():
            bits = np.flatnonzero(np.unpackbits(row.view(np.uint8), bitorder="little"))
            tokens.append(int(bits[len(bits) // 2]))
        xgr.BatchGrammarMatcher.batch_accept_token(matchers, tokens)
        steps.append(tokens)

    def python_loop():
        t, x = time.perf_counter(), 0
        while time.perf_counter() - t < a.python_us * 1e-6:
            for i in range(50):
                x += i

    pool = ThreadPoolExecutor(1)

    def run(interval: float | None, threaded: bool) -> tuple[float, float, float]:
        ms = [xgr.GrammarMatcher(compiled) for _ in range(64)]
        waits, totals = [], []
        jobs.clear()
        for tokens in steps:
            t, old = time.perf_counter(), sys.getswitchinterval()
            if interval is not None:
                sys.setswitchinterval(interval)
            if threaded:
                f = pool.submit(job, ms, tokens)
                python_loop()
                t1 = time.perf_counter()
                f.result()
                waits.append(time.perf_counter() - t1)
            else:
                job(ms, tokens)
                python_loop()
            sys.setswitchinterval(old)
            totals.append(time.perf_counter() - t)
        wait = 1e3 * statistics.median(waits) if waits else 0.0
        return 1e3 * statistics.median(totals), 1e3 * statistics.median(jobs), wait

    print(f"python loop {a.python_us / 1e3:.3f} ms; ms per step (median)")
    print(f"{'threads':>7} {'mode':<8} {'interval':>9} {'step':>7} {'job':>7} {'wait':>7}")
    for threads in a.fill_threads:
        batch = xgr.BatchGrammarMatcher(max_threads=threads)
        for threaded in (False, True):
            for interval in (None, 1e-3, 1e-4):
                step, job_ms, wait = run(interval, threaded)
                label = "default" if interval is None else f"{interval * 1e3:g} ms"
                mode = "thread" if threaded else "serial"
                print(f"{threads:>7} {mode:<8} {label:>9} {step:7.3f} {job_ms:7.3f} {wait:7.3f}")


if __name__ == "__main__":
    main()
