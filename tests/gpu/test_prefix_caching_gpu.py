"""Prefix caching on the GPU: every installed backend gives the same greedy tokens with caching on and off.

The default model (real weights) in bfloat16, on the backend's default path (CUDA graphs for decode steps,
async scheduling) and eagerly, for: a batch sharing a long system prompt, prompts whose common prefix ends
inside a block, an exact repeat of an earlier prompt, n > 1; and, on a tiny KV cache with a small token budget,
preemption and chunked prefill. Caching is switched on the same engine (the block manager's switch, which is
all that ``enable_prefix_caching`` sets), so both runs share weights and graphs. Each case also checks that
cached tokens were really skipped. Results: one line per (backend, mode, case) in the GPU results table.
"""

from __future__ import annotations

import gc

import pytest
import torch

from attnserve import LLM, SamplingParams
from tests.gpu.backends import _has
from tests.gpu.conftest import RESULTS

pytestmark = pytest.mark.gpu

SYSTEM = ("You are a careful assistant. Answer briefly and precisely. Use plain words. If a question has a number "
          "for an answer, give the number first and then one sentence of explanation. ") * 4
QUESTIONS = ["What is the boiling point of water in Celsius?", "Name the largest planet.", "What is 7 times 8?",
             "Who wrote Hamlet?", "What colour is the sky on a clear day?", "How many legs does a spider have?"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def _targets() -> list[tuple[str, str, dict]]:
    out = [("TRITON_ATTN", "TRITON_ATTN", {}), ("FLEX_ATTENTION", "FLEX_ATTENTION", {})]
    if _has("flash_attn_interface"):
        out.append(("FLASH_ATTN/3", "FLASH_ATTN", {"flash_attn_version": 3}))
    if _has("flash_attn.cute"):
        out.append(("FLASH_ATTN/4", "FLASH_ATTN", {"flash_attn_version": 4}))
    if _has("flashinfer"):
        out.append(("FLASHINFER", "FLASHINFER", {}))
    return out


def _prompts(tok) -> dict[str, list[list[int]]]:
    chat = [tok.apply_chat_template([{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
                                    add_generation_prompt=True) for q in QUESTIONS]
    chat = [list(p["input_ids"]) if isinstance(p, dict) or hasattr(p, "keys") else list(p) for p in chat]
    base = chat[0]
    inside = [base[:37] + chat[1][-20:], base[:37] + chat[2][-25:]]  # 37 shared tokens: 2 full blocks + 5
    return {"shared prefix batch": chat, "prefix ends inside a block": inside, "exact repeat": [chat[3]]}


def _run(llm: LLM, caching: bool, prompts, params, sequential: bool = False):
    bm = llm.engine.block_manager
    bm.enable_prefix_caching = caching
    llm.reset_prefix_cache()
    hits0 = llm.engine.scheduler.prefix_cache_stats.hits
    if sequential:  # one call per prompt: each finds what the ones before it left in the cache
        outs = [o for p in prompts for o in llm.generate([p], params)]
    else:
        outs = llm.generate(prompts, params)
    if caching and sequential and len(prompts) == 1:
        outs += llm.generate(prompts, params)  # the repeat: found cached
    assert set(bm.ref_counts) == {0}  # every block free or cached: none leaked
    return [[c.token_ids for c in o.outputs] for o in outs], llm.engine.scheduler.prefix_cache_stats.hits - hits0


def _check(label: str, mode: str, llm: LLM, prompts, name: str, params=GREEDY, sequential: bool = False) -> None:
    off, _ = _run(llm, False, prompts, params, sequential)
    on, hits = _run(llm, True, prompts, params, sequential)
    if len(on) > len(off):  # the exact repeat ran twice with caching on
        off = off + off
    equal = sum(a == b for a, b in zip(on, off))
    RESULTS.append({"backend": label, "version": mode, "case": f"prefix caching: {name} ({hits} cached)",
                    "pass": equal == len(off) and hits > 0, "max_err": float(len(off) - equal), "rel_err": 0.0})
    assert hits > 0, f"{label} {mode} {name}: nothing was found cached"
    assert on == off, f"{label} {mode} {name}: {equal}/{len(off)} completions equal"


@pytest.mark.parametrize("label, backend, attention_config", _targets(), ids=[t[0] for t in _targets()])
@pytest.mark.parametrize("mode", ["graphs", "eager"])
def test_greedy_tokens_equal_with_prefix_caching_on_and_off(label, backend, attention_config, mode, default_tokenizer):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA")
    llm = LLM(dtype="bfloat16", attention_backend=backend, attention_config=attention_config,
              enforce_eager=mode == "eager", kv_cache_memory=2 << 30, max_num_seqs=16)
    try:
        prompts = _prompts(default_tokenizer)
        _check(label, mode, llm, prompts["shared prefix batch"], "shared prefix batch")
        _check(label, mode, llm, prompts["prefix ends inside a block"], "prefix ends inside a block", sequential=True)
        _check(label, mode, llm, prompts["exact repeat"], "exact repeat", sequential=True)
        _check(label, mode, llm, [prompts["shared prefix batch"][4]], "n=3",
               SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, n=3))
    finally:
        del llm
        gc.collect()
        torch.cuda.empty_cache()


@pytest.mark.parametrize("label, backend, attention_config", _targets(), ids=[t[0] for t in _targets()])
def test_preemption_and_chunked_prefill_with_prefix_caching(label, backend, attention_config, default_tokenizer):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA")
    # 40 blocks of 16 tokens for six ~130-token prompts + 24 tokens each: preemption; 64-token steps: chunks
    llm = LLM(dtype="bfloat16", attention_backend=backend, attention_config=attention_config,
              num_gpu_blocks=40, max_num_batched_tokens=64, max_num_seqs=8)
    try:
        prompts = _prompts(default_tokenizer)["shared prefix batch"]
        _check(label, "tiny KV, 64-token steps", llm, prompts, "preemption + chunked prefill")
    finally:
        del llm
        gc.collect()
        torch.cuda.empty_cache()
