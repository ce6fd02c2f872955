"""The nano-vllm throughput workload (``vs_vllm.sh tp``'s: Qwen3-0.6B shape, 256 requests, U[100, 1024] in and
out) with TRITON_ATTN's decode calls ordered longest context first (``triton_attn_plan.ORDER_DECODES`` on) and in
request order (off), alternated, each run a process of its own.

    python -m benchmarks.gpu.decode_order_ab --tokenizer DIR [--rounds 2] [--json OUT]

Prints each run's output tokens per second and the median per mode.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

RUN = """
import sys
import attnserve.attention.backends.triton_attn_plan as plan
plan.ORDER_DECODES = {ordered}
from attnserve.entrypoints.cli.main import main
sys.exit(main({argv!r}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json")
    a = ap.parse_args()
    runs = []
    for r in range(a.rounds):
        for ordered in (True, False) if r % 2 == 0 else (False, True):
            with tempfile.TemporaryDirectory() as d:
                out = os.path.join(d, "tp.json")
                argv = ["bench", "throughput", "--model", "benchmarks/shapes/qwen3-0.6b", "--load-format", "dummy",
                        "--dtype", "bfloat16", "--tokenizer", a.tokenizer, "--seed", "0", "--no-progress",
                        "--max-model-len", "2304", "--max-num-seqs", "256", "--num-prompts", "256", "--input-len",
                        "562", "--output-len", "562", "--range-ratio", "0.822", "--output-json", out]  # fmt: skip
                subprocess.run([sys.executable, "-c", RUN.format(ordered=ordered, argv=argv)], check=True)
                with open(out) as f:
                    res = json.load(f)
            tok_s = res["results"][0]["output_tokens_per_s"]  # the attnserve row (no baseline)
            runs.append({"ordered": ordered, "output_tok_s": tok_s})
            print(runs[-1], flush=True)
    for ordered in (True, False):
        mine = [r["output_tok_s"] for r in runs if r["ordered"] == ordered]
        print(
            f"{'longest first' if ordered else 'request order':<14} median {statistics.median(mine):,.0f} output tok/s"
        )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(runs, f, indent=1)


if __name__ == "__main__":
    main()
