"""attnserve vs transformers on this CPU: the default model, the same prompts, greedy, in one run.

    python benchmarks/cpu_generate_vs_transformers.py [--max-tokens 64] [--output-json out.json]

Measures (1) the wall time of the README's main job, ``attnserve generate`` in a subprocess (model load
included); (2) in this process, float32: attnserve ``LLM.generate`` on all prompts in one batch and one at a
time, and transformers' ``generate`` (same GGUF, greedy, its default attention, KV cache) one prompt at a
time and as one left-padded batch. Output tokens/s = generated tokens / generation wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch

PROMPTS = [
    "What is the capital of France?",
    "Write a short poem about autumn leaves.",
    "Explain what a hash table is in two sentences.",
    "List three uses of copper.",
    "How do airplanes stay in the air?",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--output-json", default=None)
    args = ap.parse_args()
    from attnserve.benchmarks.hf_baseline import check_transformers_baseline
    from attnserve.refusals import Refused, message

    try:
        check_transformers_baseline(None, "auto")  # before the runs: transformers reads the GGUF with accelerate
    except Refused as e:
        sys.exit(f"error: {message(e.refusal)}")
    n = args.max_tokens
    results: dict = {"max_tokens": n, "prompts": len(PROMPTS), "torch_threads": torch.get_num_threads()}

    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "attnserve", "generate"], capture_output=True, text=True)
    results["attnserve_generate_cli_wall_s"] = time.perf_counter() - t
    assert proc.returncode == 0, proc.stderr

    from attnserve import LLM, SamplingParams
    from attnserve.model_executor.loader import resolve_model_source

    llm = LLM(dtype="float32", device="cpu")
    tok = llm.tokenizer
    chats = [
        tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        for p in PROMPTS
    ]
    ids = [tok.encode(c, add_special_tokens=False) for c in chats]
    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    llm.generate(ids[0], SamplingParams(temperature=0.0, max_tokens=4))  # warm-up

    t = time.perf_counter()
    outs = llm.generate(ids, params)
    dt = time.perf_counter() - t
    results["attnserve_batch"] = {"s": dt, "output_tok_per_s": len(PROMPTS) * n / dt}
    t = time.perf_counter()
    for p in ids:
        llm.generate(p, params)
    dt = time.perf_counter() - t
    results["attnserve_one_at_a_time"] = {"s": dt, "output_tok_per_s": len(PROMPTS) * n / dt}
    ours = [o.outputs[0].token_ids for o in outs]

    from transformers import AutoModelForCausalLM

    src = resolve_model_source(None)
    hf = AutoModelForCausalLM.from_pretrained(
        src.folder, gguf_file=os.path.basename(src.path), dtype=torch.float32
    ).eval()
    gen_kwargs = dict(
        max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=tok.pad_token_id or tok.eos_token_id
    )
    with torch.no_grad():
        hf.generate(torch.tensor([ids[0]]), max_new_tokens=4, do_sample=False)  # warm-up
        t = time.perf_counter()
        hf_tokens = [hf.generate(torch.tensor([p]), **gen_kwargs)[0, len(p) :].tolist() for p in ids]
        dt = time.perf_counter() - t
        results["transformers_one_at_a_time"] = {"s": dt, "output_tok_per_s": len(PROMPTS) * n / dt}
        tok.padding_side = "left"
        batch = tok.pad({"input_ids": ids}, return_tensors="pt")
        t = time.perf_counter()
        hf.generate(**batch, **gen_kwargs)
        dt = time.perf_counter() - t
        results["transformers_batch"] = {"s": dt, "output_tok_per_s": len(PROMPTS) * n / dt}
    # min_new_tokens masks EOS, so compare only up to the first EOS of either side
    eos = tok.eos_token_id
    cut = lambda xs: xs[: xs.index(eos)] if eos in xs else xs
    results["greedy_tokens_equal_before_eos"] = all(
        cut(a)[: len(cut(b))] == cut(b)[: len(cut(a))] for a, b in zip(ours, hf_tokens)
    )
    results["speedup_batch"] = (
        results["attnserve_batch"]["output_tok_per_s"] / results["transformers_batch"]["output_tok_per_s"]
    )
    results["speedup_one_at_a_time"] = (
        results["attnserve_one_at_a_time"]["output_tok_per_s"]
        / results["transformers_one_at_a_time"]["output_tok_per_s"]
    )
    print(json.dumps(results, indent=2))
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
