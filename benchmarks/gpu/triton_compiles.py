"""Which Triton kernels compile during an attnserve command, and when: a kernel compiled inside a timed run costs
its requests' TTFT (session 27: TRITON_ATTN's first `bench throughput` on a machine, TTFT p50 554 ms against 301 ms
in the second run, whose kernels came from Triton's disk cache).

``python -m benchmarks.gpu.triton_compiles [--json OUT] -- attnserve ARGS...`` runs ``attnserve ARGS`` in this
process with Triton's JIT hooks set (``triton.knobs.runtime.jit_cache_hook`` before each compile,
``jit_post_compile_hook`` after it), and the time each ``LLM.generate`` / ``LLMEngine.step`` loop starts. Printed
last: every compile of more than ``--min-s`` seconds (a disk-cache load takes milliseconds), with its kernel, its
launch options, its specialization (the arguments' types, ``D`` = divisible by 16) and its start in seconds since
the process started; the ones that started after the first engine step are marked ``IN RUN``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

T0 = time.perf_counter()


def install_hooks(records: list[dict]) -> dict:
    """Set Triton's JIT hooks to append one record per compile to ``records``; returns the marks dict the
    engine-step patch fills (``first_step``: seconds since start)."""
    import triton

    pending: dict = {}

    def before(*, key, repr, fn, compile, is_manual_warmup, already_compiled):  # noqa: A002 - Triton's names
        pending[id(key)] = time.perf_counter()
        return False  # compile as usual

    def after(*, key, repr, fn, compile, is_manual_warmup, already_compiled):  # noqa: A002
        start = pending.pop(id(key), time.perf_counter())
        records.append(dict(start_s=round(start - T0, 3), seconds=round(time.perf_counter() - start, 3), kernel=repr))
        return False

    triton.knobs.runtime.jit_cache_hook = before
    triton.knobs.runtime.jit_post_compile_hook = after
    marks: dict = {}
    from attnserve.engine.llm_engine import LLMEngine

    step = LLMEngine.step

    def timed_step(self, *a, **kw):
        marks.setdefault("first_step", round(time.perf_counter() - T0, 3))
        return step(self, *a, **kw)

    LLMEngine.step = timed_step
    return marks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json")
    ap.add_argument("--min-s", type=float, default=0.05)
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- attnserve ARGS...")
    args = ap.parse_args()
    cmd = [c for c in args.command if c != "--"]
    assert cmd and cmd[0] == "attnserve", "usage: ... -- attnserve ARGS..."
    records: list[dict] = []
    marks = install_hooks(records)
    from attnserve.entrypoints.cli.main import main as attnserve_main

    rc = attnserve_main(cmd[1:])
    first = marks.get("first_step")
    slow = [r for r in records if r["seconds"] >= args.min_s]
    print(f"\n== {len(records)} Triton compiles or cache loads, {len(slow)} of >= {args.min_s} s; first step {first} s")
    for r in slow:
        where = "IN RUN" if first is not None and r["start_s"] >= first else "start-up"
        print(f"{r['start_s']:9.2f} s {r['seconds']:7.2f} s  {where:<8} {r['kernel'][:400]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(command=cmd, rc=rc, first_step_s=first, compiles=records), f, indent=1)
    sys.exit(rc)


if __name__ == "__main__":
    main()
