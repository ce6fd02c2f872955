"""End to end on a GPU: the default model (real weights) with every installed attention backend.

* float32: every backend that supports it generates the same greedy tokens (5 prompts x 64 tokens), and
  the same as transformers in float32 on the same GPU.
* bfloat16: the first 16 tokens of each backend against transformers' bfloat16 greedy output; where they
  differ, the report gives the first differing step and transformers' logit margin (top-1 minus top-2)
  there, the measure of how close to a tie the choice was.

``python -m benchmarks.gpu.e2e [GGUF] [--json OUT]`` prints a table and writes JSON. The first engine sizes
its KV cache by profiling (gpu_memory_utilization); the others use a fixed 1 GiB budget.
"""

from __future__ import annotations

import argparse
import gc
import json
import os

import torch

from attnserve import SamplingParams
from tests.gpu.backends import _has

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Write a haiku about the sea.",
    "1, 2, 3, 4,",
    "<|im_start|>user\nWhat is the boiling point of water in Celsius?<|im_end|>\n<|im_start|>assistant\n",
]
NEW_TOKENS = 64
BF16_CHECKED = 16


def backends(dtype: torch.dtype) -> list[tuple[str, str, dict]]:
    """(label, backend, attention_config) installed here that support ``dtype``."""
    out = [
        ("TRITON_ATTN", "TRITON_ATTN", {}),
        ("TRITON_ATTN eager", "TRITON_ATTN", {}),
        ("TRITON_ATTN pd", "TRITON_ATTN", {"use_prefill_decode_attention": True}),
        ("FLEX_ATTENTION", "FLEX_ATTENTION", {}),
    ]
    if dtype != torch.float32:
        if _has("flash_attn_interface"):
            out.append(("FLASH_ATTN/3", "FLASH_ATTN", {"flash_attn_version": 3}))
        if _has("flash_attn.cute"):
            out.append(("FLASH_ATTN/4", "FLASH_ATTN", {"flash_attn_version": 4}))
        if _has("flashinfer"):
            out.append(("FLASHINFER", "FLASHINFER", {}))
    return out


@torch.no_grad()
def hf_greedy(model, ids: list[int], n: int) -> tuple[list[int], list[float]]:
    """transformers' greedy tokens and the top-1 minus top-2 logit margin at each step."""
    dev = next(model.parameters()).device
    out = model(torch.tensor([ids], device=dev), use_cache=True)
    past, toks, margins = out.past_key_values, [], []
    logits = out.logits[0, -1].float()
    for _ in range(n):
        top = torch.topk(logits, 2)
        toks.append(int(top.indices[0]))
        margins.append(float(top.values[0] - top.values[1]))
        out = model(torch.tensor([[toks[-1]]], device=dev), past_key_values=past, use_cache=True)
        past, logits = out.past_key_values, out.logits[0, -1].float()
    return toks, margins


def transformers_reference(gguf: str, dtype: torch.dtype, tokenizer) -> dict[str, tuple[list[int], list[float]]]:
    from transformers import AutoModelForCausalLM

    model = (
        AutoModelForCausalLM.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf), dtype=dtype)
        .cuda()
        .eval()
    )
    ref = {p: hf_greedy(model, tokenizer.encode(p), NEW_TOKENS) for p in PROMPTS}
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return ref


def run(gguf: str) -> list[dict]:
    from attnserve import LLM

    rows, first = [], True
    dtypes = os.environ.get("ATTNSERVE_E2E_DTYPES", "float32,bfloat16").split(",")
    only = os.environ.get("ATTNSERVE_E2E_BACKENDS")  # comma-separated labels, to narrow a run
    for dtype in (getattr(torch, d) for d in dtypes):
        dname = str(dtype).replace("torch.", "")
        ref = None
        tokens_by_backend = {}
        for label, backend, cfg in backends(dtype):
            if only and label not in only.split(","):
                continue
            row = {"dtype": dname, "backend": label}
            try:
                mem = {"gpu_memory_utilization": 0.5} if first else {"kv_cache_memory": 1 << 30}
                eager = label.endswith(" eager")  # the same backend without CUDA graphs
                llm = LLM(
                    gguf,
                    dtype=dname,
                    device="cuda",
                    attention_backend=backend,
                    attention_config=cfg,
                    enforce_eager=eager,
                    **mem,
                )
                first = False
                runner = llm.engine.runner
                row["kv_blocks"] = runner.num_blocks
                if ref is None:
                    ref = transformers_reference(gguf, dtype, llm.tokenizer)
                params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
                outs = llm.generate(PROMPTS, params)
                toks = [o.outputs[0].token_ids for o in outs]
                tokens_by_backend[label] = toks
                checked = NEW_TOKENS if dtype == torch.float32 else BF16_CHECKED
                diverge = []
                for p, t in zip(PROMPTS, toks):
                    r, margins = ref[p]
                    k = next((i for i in range(checked) if t[i] != r[i]), None)
                    if k is not None:
                        diverge.append({"prompt": p[:24], "step": k, "hf_margin": round(margins[k], 4)})
                row["match_hf"] = not diverge
                row["graph_replays"] = runner.cuda_graphs.replays if runner.cuda_graphs is not None else 0
                row["divergences"] = diverge
                del llm
            except Exception as e:  # recorded, the other backends still run
                import traceback

                row["error"] = f"{type(e).__name__}: {e}"[:300]
                print(traceback.format_exc()[-2000:], flush=True)
            gc.collect()
            torch.cuda.empty_cache()
            rows.append(row)
            print(json.dumps(row), flush=True)
        if dtype == torch.float32 and tokens_by_backend:  # all backends identical to each other
            base = next(iter(tokens_by_backend.values()))
            rows.append(
                {
                    "dtype": dname,
                    "backend": "all float32 backends identical",
                    "match_hf": all(t == base for t in tokens_by_backend.values()),
                    "divergences": [],
                }
            )
    return rows


def table(rows: list[dict]) -> str:
    lines = [
        f"{'dtype':<9} {'backend':<32} {'graph replays':>13} {'same as transformers':<21} "
        "divergences (prompt, step, hf margin)"
    ]
    for r in rows:
        status = "ERROR " + r["error"][:80] if "error" in r else ("yes" if r["match_hf"] else "no")
        div = "; ".join(f"{d['prompt']!r}@{d['step']} m={d['hf_margin']}" for d in r.get("divergences", []))
        lines.append(f"{r['dtype']:<9} {r['backend']:<32} {r.get('graph_replays', ''):>13} {status:<21} {div}")
    return "\n".join(lines)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf", nargs="?")
    ap.add_argument("--json")
    args = ap.parse_args()
    from attnserve.model_executor.loader import resolve_model_source

    gguf = args.gguf or resolve_model_source(None).path
    rows = run(gguf)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(table(rows))
