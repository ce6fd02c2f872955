"""FlashInfer's first use (issue 28): a cold engine start with FLASHINFER, each in a fresh process with empty
FlashInfer and Triton caches, with its kernels compiled ahead (``ATTNSERVE_FLASHINFER_COMPILE_AHEAD=1``:
``flashinfer_modules.first_use``, sm90's fa3 prefill in the background behind fa2's) and with FlashInfer's own lazy
compile (``=0``).

    python -m benchmarks.gpu.flashinfer_first_use [--model M --tokenizer T --load-format dummy] [--json OUT]

Each run: the start and one greedy token (``first_token_s``, the figure a user waits for), then a prefill-bound
call (``--prompts`` prompts of ``--prompt-len`` tokens, one output token each) timed three times; the compile-ahead
run then waits for its background build and times that call again (the fa2 interim against the fa3 prefill).
The default model by default (its GGUF staged); any model with ``--model`` (e.g. a ``benchmarks/shapes`` folder with
``--load-format dummy``). Every cache starts empty, attnserve's too (``ATTNSERVE_CACHE_DIR``: the GEMV plan is timed
at a first start); ``--no-skinny-gemm`` leaves that timing out, to see FlashInfer's part alone.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile

CHILD = r"""
import json, logging, sys, time
t0 = time.perf_counter()
logging.basicConfig(level=logging.INFO, format="%(relativeCreated)7.0f ms %(name)s: %(message)s")
from attnserve import LLM, SamplingParams
from attnserve.attention.backends import flashinfer_jit as fj
kw, prompts, plen = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
llm = LLM(attention_backend="FLASHINFER", dtype="bfloat16", **kw)
greedy = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
llm.generate([[11] * 16], greedy)
first = time.perf_counter() - t0
batch = [[(7 * i + j) % 1000 + 10 for j in range(plen)] for i in range(prompts)]

def timed(calls=3):
    out = []
    for _ in range(calls):
        t = time.perf_counter()
        llm.generate(batch, greedy)
        out.append(round(time.perf_counter() - t, 4))
    return min(out)

def wrappers():  # which prefill wrapper each builder planned last, and FlashInfer's backend for it
    return [{"interim_plans": b.interim_plans, "interim_pending": b.prefill_interim is not None,
             "prefill_backend": getattr(b.prefill, "_backend", None)} for b in llm.engine.runner.builders]

report = {"first_token_s": round(first, 2), "prefill_call_s": timed()}
report["interim_prefill_plans"] = sum(getattr(b, "interim_plans", 0) for b in llm.engine.runner.builders)
warm = [w for w in fj._WARMUPS.values()]
report["modules_now"] = [m.name() for w in warm for m in w.first.now]
report["modules_later"] = [m.name() for w in warm for m in w.first.later]
if any(w.first.later for w in warm) and sys.argv[4] == "1":
    t = time.perf_counter()
    for item in fj._LATER.values():
        item.done.wait()
    report["later_wait_s"] = round(time.perf_counter() - t, 2)
    report["later_errors"] = [i.error for i in fj._LATER.values() if i.error]
    report["later_done_after_start_s"] = round(time.perf_counter() - t0, 2)
    report["prefill_call_after_s"] = timed(6)
report["builders"] = wrappers()
print("REPORT " + json.dumps(report), flush=True)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model")
    ap.add_argument("--tokenizer")
    ap.add_argument("--load-format")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=1000)
    ap.add_argument("--no-skinny-gemm", action="store_true", help="leave out the GEMV plan's first-start timing")
    ap.add_argument("--modes", nargs="+", default=["compile_ahead", "lazy"], choices=["compile_ahead", "lazy"])
    ap.add_argument("--no-wait", dest="wait", action="store_false", help="compile_ahead: skip the background's end")
    ap.add_argument("--json")
    a = ap.parse_args()
    kw = {k: v for k, v in (("model", a.model), ("tokenizer", a.tokenizer), ("load_format", a.load_format)) if v}
    if a.no_skinny_gemm:
        kw["use_skinny_gemm"] = False
    results = {"model": a.model or "default (SmolLM2-135M-Instruct)", "prompts": [a.prompts, a.prompt_len]}
    for label in a.modes:
        on = "1" if label == "compile_ahead" else "0"
        with tempfile.TemporaryDirectory() as fresh:  # FlashInfer's, Triton's and attnserve's caches (GEMV plans)
            env = dict(os.environ, FLASHINFER_WORKSPACE_BASE=fresh, TRITON_CACHE_DIR=f"{fresh}/triton")
            env["ATTNSERVE_CACHE_DIR"] = f"{fresh}/attnserve"
            env["ATTNSERVE_FLASHINFER_COMPILE_AHEAD"] = on
            argv = [sys.executable, "-c", CHILD, json.dumps(kw), str(a.prompts), str(a.prompt_len), str(int(a.wait))]
            proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    start_new_session=True)  # fmt: skip
            out, _ = proc.communicate()
            try:  # a background compile the child left running (its ninja and nvcc) must not meet the next run
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            lines = out.splitlines()
            report = [json.loads(x[7:]) for x in lines if x.startswith("REPORT ")]
            results[label] = report[0] if report else {"error": "\n".join(lines[-15:])}
            keep = ("FlashInfer", "flashinfer", "Profiled", "KV cache", "graph", "GEMV", "warm")
            results[label]["log"] = [x for x in lines if any(k in x for k in keep)][:24]
        print(label, json.dumps(results[label], indent=1), flush=True)
        results[label]["output"] = lines[:400]  # the child's whole log (JSON only): where its start-up time goes
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
