"""Why is the engine thread slower in a constrained step? One engine, one process, batch 64 under one JSON schema
(``bench_structured_tpot``'s workload), in several modes, each timed per host part by wall clock *and* by the
engine thread's own CPU time, with every thread's CPU and run-queue wait time from ``/proc/self/task/*/schedstat``:

    free           unconstrained
    json           the engine's default: accept + fill + copy in the grammar's worker thread
    json_serial    the same work on the engine thread (``start_bitmask(in_thread=False)``)
    json_fill1     the worker, xgrammar's fill on 1 thread
    json_numpy     the engine's structured path with xgrammar taken out: the "fill" sets every bit with numpy and
                   the accept accepts (the grammar is not advanced). Tells the engine's own path from xgrammar's work

    python -m benchmarks.gpu.structured_probe [--model benchmarks/shapes/qwen3-0.6b] [--json OUT] [--profile]
        [--modes free json ...] [ENGINE FLAGS as LLM keyword=value]

Per mode the median of each part over the all-decode steps: wall ms and CPU ms (``time.thread_time``); a part
whose wall time grows while its CPU time does not waits (GIL, a lock, the run queue); one whose CPU time grows
runs slower (caches, a shared core). ``--profile``: cProfile of each mode's timed run, the functions' own time per
decode step, and the largest differences from ``free``.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import threading
import time


def thread_stats() -> dict[int, dict]:
    """Per thread of this process: name, CPU ns and run-queue wait ns (schedstat), last CPU."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                run_ns, wait_ns, _ = (int(x) for x in f.read().split())
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/self/task/{tid}/stat") as f:
                cpu = int(f.read().rsplit(")", 1)[1].split()[36])
        except (OSError, ValueError):
            continue
        out[int(tid)] = {"name": name, "run_ns": run_ns, "wait_ns": wait_ns, "cpu": cpu}
    return out


def thread_deltas(before: dict, after: dict, seconds: float) -> list[dict]:
    """Threads that ran during the interval: CPU and wait, ms, and their share of the interval."""
    rows = []
    for tid, a in after.items():
        b = before.get(tid, {"run_ns": 0, "wait_ns": 0})
        run, wait = (a["run_ns"] - b["run_ns"]) / 1e6, (a["wait_ns"] - b["wait_ns"]) / 1e6
        if run > 0.5 or wait > 0.5:
            rows.append(
                {
                    "tid": tid,
                    "name": a["name"],
                    "cpu_ms": run,
                    "wait_ms": wait,
                    "busy": run / (1e3 * seconds),
                    "cpu": a["cpu"],
                }
            )
    return sorted(rows, key=lambda r: -r["cpu_ms"])


def profile_rows(prof: cProfile.Profile, steps: int) -> dict[str, float]:
    """Each function's own time (tottime) per step, ms."""
    st = pstats.Stats(prof)
    out = {}
    for (file, line, fn), (_cc, _nc, tt, _ct, _callers) in st.stats.items():
        key = f"{os.path.basename(file)}:{line}:{fn}"
        out[key] = out.get(key, 0.0) + 1e3 * tt / max(1, steps)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="benchmarks/shapes/qwen3-0.6b")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--modes", nargs="+", default=["free", "json", "json_serial", "json_fill1", "json_numpy", "free"])
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("engine", nargs="*", help="LLM keyword=value")
    a = ap.parse_args()

    import benchmarks.structured_host as sh
    from benchmarks.gpu.bench_structured_tpot import run, workload
    from benchmarks.host_overhead import Timer

    kw, llm, prompts, free, constrained = workload(a)
    engine = llm.engine
    parts = sh.StepParts(engine, a.batch, Timer(cpu=True))
    # the engine thread's context switches per step: a voluntary one is a wait (GIL, futex), an involuntary one a
    # preemption
    step = engine.step
    import resource

    def counted_step():
        r0 = resource.getrusage(resource.RUSAGE_THREAD)
        c0 = time.thread_time()
        n = len(parts.steps)
        try:
            return step()
        finally:
            if len(parts.steps) > n:
                r1 = resource.getrusage(resource.RUSAGE_THREAD)
                s = parts.steps[-1]
                s["cpu:step"] = time.thread_time() - c0
                s["nvcsw"] = r1.ru_nvcsw - r0.ru_nvcsw
                s["nivcsw"] = r1.ru_nivcsw - r0.ru_nivcsw

    engine.step = counted_step
    structured = engine.structured
    timed_start = structured.start_bitmask  # StepParts' timed wrapper: the serial fill is timed as "fill" too

    def set_mode(mode: str):
        """Put the manager in ``mode``'s shape; returns the undo."""
        undo = []
        if mode == "json_serial":
            structured.start_bitmask = lambda sched, in_thread=True: timed_start(sched, False)
            undo.append(lambda: setattr(structured, "start_bitmask", timed_start))
        if mode == "json_fill1":
            structured.backend  # noqa: B018 - made now
            old = structured._batch
            structured._batch = structured.backend.batch_filler(1)
            undo.append(lambda: setattr(structured, "_batch", old))
        if mode == "json_numpy":
            backend = structured.backend
            old_batch, old_accept = structured._batch, backend.accept

            class AllowAll:
                def batch_fill_next_token_bitmask(self, matchers, words):
                    words.fill(-1)

            structured._batch = AllowAll()
            backend.accept = lambda matchers, tokens: []
            undo.append(lambda: setattr(structured, "_batch", old_batch))
            undo.append(lambda: setattr(backend, "accept", old_accept))
        return lambda: [u() for u in undo]

    results = {"engine": {k: str(v) for k, v in kw.items()}, "cpus": len(os.sched_getaffinity(0)), "modes": []}
    try:
        with open("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list") as f:
            results["cpu0_siblings"] = f.read().strip()
    except OSError:
        pass
    profiles = {}
    for mode in a.modes:
        params = free if mode == "free" else constrained
        undo = set_mode(mode)
        try:
            run(llm, prompts, params)  # warm-up
            before, t0 = thread_stats(), time.perf_counter()
            r = run(llm, prompts, params, parts)
            seconds = time.perf_counter() - t0
            threads = thread_deltas(before, thread_stats(), seconds)
            keys = sorted({k for s in parts.steps for k in s})
            med = {
                k: (1e3 if k not in ("nvcsw", "nivcsw") else 1) * statistics.median(s.get(k, 0.0) for s in parts.steps)
                for k in keys
            }
            mean = {
                k: (1e3 if k not in ("nvcsw", "nivcsw") else 1) * statistics.fmean(s.get(k, 0.0) for s in parts.steps)
                for k in keys
            }
            row = {
                "mode": mode,
                "tpot_ms": r["tpot_ms"],
                "valid_json": r["valid_json"],
                "steps": len(parts.steps),
                "median": med,
                "mean": mean,
                "threads": threads,
                "gc": r["gc"],
            }
            if a.profile:
                prof = cProfile.Profile()
                prof.enable()
                rp = run(llm, prompts, params, parts)
                prof.disable()
                profiles[mode] = profile_rows(prof, rp.get("decode_steps", 1))
                row["profiled_tpot_ms"] = rp["tpot_ms"]
            results["modes"].append(row)
        finally:
            undo()
        print(
            f"== {mode}: TPOT {r['tpot_ms']:.3f} ms, valid {r['valid_json']}, {len(parts.steps)} decode steps",
            flush=True,
        )
        names = [
            k
            for k in ("schedule", "forward", "sample", "output", "update", "fill", "accept", "stage", "wait", "step")
            if k in med
        ]
        print("   part     " + "".join(f"{k:>10}" for k in names))
        print("   wall ms  " + "".join(f"{med[k]:>10.3f}" for k in names))
        print("   cpu  ms  " + "".join(f"{med.get('cpu:' + k, float('nan')):>10.3f}" for k in names))
        print(
            f"   context switches per step: voluntary {med.get('nvcsw')}, involuntary {med.get('nivcsw')}; mean step {mean['step']:.3f} ms"
        )
        for t in threads[:8]:
            print(
                f"   thread {t['name']:<20} cpu {t['cpu_ms']:9.1f} ms ({t['busy']:.0%})  run-queue wait {t['wait_ms']:8.1f} ms  last cpu {t['cpu']}"
            )
    if profiles:
        base = profiles.get("free", {})
        for mode, prof in profiles.items():
            if mode == "free":
                continue
            diff = sorted(((prof.get(k, 0.0) - base.get(k, 0.0), k) for k in set(prof) | set(base)), reverse=True)
            print(f"== cProfile, {mode} minus free, own ms per decode step (largest 25):")
            for d, k in diff[:25]:
                print(f"   {d:+8.4f}  {prof.get(k, 0.0):8.4f}  {k}")
        top = sorted(base.items(), key=lambda kv: -kv[1])[:25]
        print("== cProfile, free, own ms per decode step (largest 25):")
        for k, v in top:
            print(f"   {v:8.4f}  {k}")
        results["profiles"] = profiles
    print("threads alive:", [t.name for t in threading.enumerate()])
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
