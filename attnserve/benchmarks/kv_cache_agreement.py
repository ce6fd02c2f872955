"""An fp8 KV cache against a 16-bit one on the same model: greedy-token agreement and next-token KL.

    python -m attnserve.benchmarks.kv_cache_agreement [--model M] [--kv-cache-dtype fp8] [--attention-backend B]
        [--num-tokens 64] [--output-json out.json]

Two engines of the same model, weights and attention backend, one with ``kv_cache_dtype auto`` (the reference) and
one with the fp8 cache, run the fixed prompt set (:data:`PROMPTS`, chat-formatted when the tokenizer has a
template) in lockstep, teacher-forced: at every step both engines get the same tokens, the reference's greedy
choice. Each step is a real engine step through each engine's model runner (a batched prefill first, then batched
decode steps, with CUDA graphs where the runner captured them), so the fp8 cache is written and read by the
backend's prefill and decode kernels. Reported over all prompts and positions:

* ``greedy_agreement``: the fraction of positions where the fp8 engine's argmax equals the reference's;
* ``mean_kl`` / ``max_kl``: KL(reference || fp8) of the next-token distributions (nats), softmax of float32 logits;
* ``first_divergence_mean``: mean position of each prompt's first disagreement (``num_tokens`` when none).
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import torch

PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea.",
    "Explain in two sentences why the sky is blue.",
    "List three prime numbers greater than 100.",
    "What is the boiling point of water at sea level in Fahrenheit?",
    "Translate 'good morning' into Spanish, French and German.",
    "Summarize the plot of Romeo and Juliet in one sentence.",
    "def fibonacci(n):",
    "The three laws of motion formulated by Newton are",
    "Give me a recipe for a simple tomato sauce.",
    "Why do cats purr?",
    "Once upon a time, in a small village by the mountains,",
    "What is 17 multiplied by 23?",
    "Name the planets of the solar system in order.",
    "Describe the water cycle.",
    "SELECT name, age FROM users WHERE",
]


def _prompt_ids(engine, prompts: list[str]) -> list[list[int]]:
    tok = engine.tokenizer
    if getattr(tok, "chat_template", None):
        return [
            list(
                tok.apply_chat_template(
                    [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True, return_dict=False
                )
            )
            for p in prompts
        ]
    return [tok.encode(p) for p in prompts]


class _Forced:
    """Steps one engine's model runner over fixed requests: a prefill of each prompt, then one token per step."""

    def __init__(self, engine, prompts: list[list[int]], num_tokens: int) -> None:
        from attnserve.core.sampling_params import SamplingParams

        self.runner = engine.runner
        bs = self.runner.block_size
        self.params = SamplingParams(temperature=0.0, max_tokens=num_tokens)
        width = -(-(max(map(len, prompts)) + num_tokens) // bs)
        # disjoint blocks per request, from 1 (the profiling step's convention; the last block is the graphs' null)
        self.tables = [list(range(1 + i * width, 1 + (i + 1) * width)) for i in range(len(prompts))]
        if 1 + len(prompts) * width > self.runner.num_blocks:
            most = (self.runner.num_blocks - 1) // len(prompts) * bs - max(map(len, prompts))
            raise ValueError(
                f"argument --num-tokens: {num_tokens} not allowed (allowed: at most {max(most, 0)}: the "
                f"{len(prompts)} prompts and their tokens fill {self.runner.num_blocks} KV blocks of {bs} tokens)"
            )
        self.sequences = [list(p) for p in prompts]

    def step(self, new_tokens: list[int] | None) -> torch.Tensor:  # (P, vocab) float32 logits of the next token
        from attnserve.core.step import ScheduledRequest, SchedulerOutput

        reqs = []
        for i, seq in enumerate(self.sequences):
            if new_tokens is None:  # the prefill
                reqs.append(ScheduledRequest(f"r{i}", list(seq), 0, self.tables[i], self.params, True))
            else:
                seq.append(new_tokens[i])
                reqs.append(ScheduledRequest(f"r{i}", [new_tokens[i]], len(seq) - 1, self.tables[i], self.params, True))
        return self.runner.compute_logits(SchedulerOutput(requests=reqs))


def compare(reference, candidate, prompts: list[list[int]], num_tokens: int) -> dict:
    """Teacher-forced lockstep of two engines (LLMEngine, in-process executor) over ``prompts`` (token ids) for ``num_tokens``
    positions; the agreement and KL figures of the module docstring."""
    ref, cand = _Forced(reference, prompts, num_tokens), _Forced(candidate, prompts, num_tokens)
    agree = total = 0
    kls: list[float] = []
    first = [num_tokens] * len(prompts)
    tokens = None
    for pos in range(num_tokens):
        lr, lc = ref.step(tokens), cand.step(tokens)
        lp_r, lp_c = torch.log_softmax(lr.float(), -1), torch.log_softmax(lc.float(), -1)
        kl = (lp_r.exp() * (lp_r - lp_c)).sum(-1).clamp_min(0.0)  # (P,)
        kls += kl.tolist()
        greedy_r, greedy_c = lr.argmax(-1), lc.argmax(-1)
        same = (greedy_r == greedy_c).tolist()
        agree += sum(same)
        total += len(same)
        for i, s in enumerate(same):
            if not s and first[i] == num_tokens:
                first[i] = pos
        tokens = greedy_r.tolist()  # both continue with the reference's choice
    return {
        "positions": total,
        "greedy_agreement": agree / total,
        "mean_kl": sum(kls) / len(kls),
        "max_kl": max(kls),
        "first_divergence_mean": sum(first) / len(first),
    }


def run(
    model: str | None = None,
    kv_cache_dtype: str = "fp8",
    attention_backend: str | None = None,
    num_tokens: int = 64,
    dtype: str = "bfloat16",
    device: str = "auto",
    calculate_kv_scales: bool = False,
    prompts: list[str] | None = None,
    num_gpu_blocks: int = 1024,
) -> dict:
    """Build both engines and :func:`compare` them; the JSON-ready result (settings and figures)."""
    from attnserve.config.engine_args import build_engine_config
    from attnserve.engine.llm_engine import LLMEngine

    prompts = prompts or PROMPTS
    common = dict(
        dtype=dtype,
        device=device,
        attention_backend=attention_backend,
        num_gpu_blocks=num_gpu_blocks,
        max_num_seqs=max(len(prompts), 1),
    )
    reference = LLMEngine(build_engine_config(model, kv_cache_dtype="auto", **common), warn_kv_cache_limit=False)
    candidate = LLMEngine(
        build_engine_config(model, kv_cache_dtype=kv_cache_dtype, calculate_kv_scales=calculate_kv_scales, **common),
        warn_kv_cache_limit=False,
    )
    ids = _prompt_ids(reference, prompts)
    figures = compare(reference, candidate, ids, num_tokens)
    runner = candidate.runner
    return {
        "model": model or "default",
        "attention_backend": runner.backend.name,
        "dtype": dtype,
        "kv_cache_dtype": kv_cache_dtype,
        "kv_scales": runner.kv_scales_source,
        "prompts": len(prompts),
        "num_tokens": num_tokens,
        **figures,
    }


def _positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} not allowed (allowed: integer >= 1)")
    return value


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m attnserve.benchmarks.kv_cache_agreement", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--model", default=None, help="default: the default model")
    p.add_argument("--kv-cache-dtype", default="fp8", choices=["fp8", "fp8_e4m3", "fp8_e5m2"])
    p.add_argument("--calculate-kv-scales", action="store_true")
    p.add_argument("--attention-backend", default=None)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--device", default="auto")
    p.add_argument("--num-tokens", type=_positive_int, default=64)
    p.add_argument("--output-json", default=None)
    args = p.parse_args(argv)
    try:
        result = run(
            args.model,
            args.kv_cache_dtype,
            args.attention_backend,
            args.num_tokens,
            args.dtype,
            args.device,
            args.calculate_kv_scales,
        )
    except ValueError as e:  # refusals (config, backend, device) and the token count: one line, exit 2
        p.error(str(e))
    text = json.dumps(result, indent=2)
    print(text)
    if args.output_json:
        with open(args.output_json, "w") as f:
            f.write(text + "\n")
    return 0 if math.isfinite(result["mean_kl"]) else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
