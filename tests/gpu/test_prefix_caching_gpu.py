"""Prefix caching on the GPU: every installed backend gives the same greedy tokens with caching on and off.

The default model (real weights) on the backend's default path (CUDA graphs for decode steps, async
scheduling) and eagerly, for: a batch sharing a long system prompt, prompts whose common prefix ends inside a
block, an exact repeat of an earlier prompt, n > 1; and, on a tiny KV cache with a small token budget,
preemption and chunked prefill. Caching is switched on the same engine (the block manager's switch, which is
all that ``enable_prefix_caching`` sets), so both runs share weights and graphs; each case checks that cached
tokens were really skipped and that no block leaked.

float32 (TRITON_ATTN, FLEX_ATTENTION): the tokens must be equal. bfloat16 (every backend): a cached prefix
changes how a prompt is split into kernel calls, so sums run in another order; where the two runs part, each
run's token must be among the other's two most likely (a near tie, vLLM's ``check_logprobs_close``), and the
results table counts such completions. Generation stops at EOS: past it a model's choices are near ties.
"""

from __future__ import annotations

import gc

import pytest
import torch

from attnserve import LLM, SamplingParams
from tests.gpu.backends import _has
from tests.gpu.conftest import RESULTS

pytestmark = pytest.mark.gpu

SYSTEM = (
    "You are a careful assistant. Answer briefly and precisely. Use plain words. If a question has a number "
    "for an answer, give the number first and then one sentence of explanation. "
) * 4
QUESTIONS = [
    "What is the boiling point of water in Celsius?",
    "Name the largest planet.",
    "What is 7 times 8?",
    "Who wrote Hamlet?",
    "What colour is the sky on a clear day?",
    "How many legs does a spider have?",
]
GREEDY = SamplingParams(temperature=0.0, max_tokens=32, logprobs=2)


def _targets() -> list[tuple[str, str, dict, torch.dtype]]:
    out = [
        ("TRITON_ATTN", "TRITON_ATTN", {}, torch.float32),
        ("FLEX_ATTENTION", "FLEX_ATTENTION", {}, torch.float32),
        ("TRITON_ATTN", "TRITON_ATTN", {}, torch.bfloat16),
        ("FLEX_ATTENTION", "FLEX_ATTENTION", {}, torch.bfloat16),
    ]
    if _has("flash_attn_interface"):
        out.append(("FLASH_ATTN/3", "FLASH_ATTN", {"flash_attn_version": 3}, torch.bfloat16))
    if _has("flash_attn.cute"):
        out.append(("FLASH_ATTN/4", "FLASH_ATTN", {"flash_attn_version": 4}, torch.bfloat16))
    if _has("flashinfer"):
        out.append(("FLASHINFER", "FLASHINFER", {}, torch.bfloat16))
    return out


TARGETS = _targets()
IDS = [f"{t[0]}-{str(t[3]).removeprefix('torch.')}" for t in TARGETS]


def _prompts(tok) -> dict[str, list[list[int]]]:
    chat = [
        tok.apply_chat_template(
            [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}], add_generation_prompt=True
        )
        for q in QUESTIONS
    ]
    chat = [list(p["input_ids"]) if hasattr(p, "keys") else list(p) for p in chat]
    inside = [chat[0][:37] + chat[1][-20:], chat[0][:37] + chat[2][-25:]]  # 37 shared tokens: 2 full blocks + 5
    return {"shared prefix batch": chat, "prefix ends inside a block": inside, "exact repeat": [chat[3]]}


def _run(llm: LLM, caching: bool, prompts, params, sequential: bool):
    bm = llm.engine.block_manager
    bm.enable_prefix_caching = caching
    llm.reset_prefix_cache()
    hits0 = llm.engine.scheduler.prefix_cache_stats.hits
    if sequential:  # one call per prompt: each finds what the ones before it left in the cache
        outs = [o for p in prompts for o in llm.generate([p], params)]
    else:
        outs = llm.generate(prompts, params)
    if sequential and len(prompts) == 1:
        outs += llm.generate(prompts, params)  # the repeat (found cached when caching is on)
    assert set(bm.ref_counts) == {0}  # every block free or cached: none leaked
    return [c for o in outs for c in o.outputs], llm.engine.scheduler.prefix_cache_stats.hits - hits0


def _near_tie(a, b) -> bool:
    """Where the token lists first differ, each one's token is among the other's top 2."""
    for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids)):
        if x != y:
            return y in a.logprobs[i] and x in b.logprobs[i]
    return len(a.token_ids) == len(b.token_ids)


def _check(
    label: str, dtype: torch.dtype, mode: str, llm: LLM, prompts, name: str, params=GREEDY, sequential: bool = False
) -> None:
    off, _ = _run(llm, False, prompts, params, sequential)
    on, hits = _run(llm, True, prompts, params, sequential)
    exact = sum(a.token_ids == b.token_ids for a, b in zip(on, off))
    ties = sum(a.token_ids != b.token_ids and _near_tie(a, b) for a, b in zip(on, off))
    ok = hits > 0 and (exact == len(off) if dtype == torch.float32 else exact + ties == len(off))
    RESULTS.append(
        {
            "backend": label,
            "version": str(dtype).removeprefix("torch."),
            "case": f"{mode}: {name}: {exact}/{len(off)} equal, {ties} near ties, {hits} tokens cached",
            "pass": ok,
            "max_err": float(len(off) - exact),
            "rel_err": 0.0,
        }
    )
    assert hits > 0, f"{label} {mode} {name}: nothing was found cached"
    assert ok, f"{label} {dtype} {mode} {name}: {exact}/{len(off)} equal, {ties} near ties"


def _cases(label, dtype, mode, llm, tok) -> None:
    prompts = _prompts(tok)
    _check(label, dtype, mode, llm, prompts["shared prefix batch"], "shared prefix batch")
    _check(
        label, dtype, mode, llm, prompts["prefix ends inside a block"], "prefix ends inside a block", sequential=True
    )
    _check(label, dtype, mode, llm, prompts["exact repeat"], "exact repeat", sequential=True)
    _check(
        label,
        dtype,
        mode,
        llm,
        [prompts["shared prefix batch"][4]],
        "n=3",
        SamplingParams(temperature=0.0, max_tokens=32, logprobs=2, n=3),
    )


def _engine(backend, attention_config, dtype, **kwargs) -> LLM:
    return LLM(
        dtype=str(dtype).removeprefix("torch."), attention_backend=backend, attention_config=attention_config, **kwargs
    )


def _release(llm) -> None:
    del llm
    gc.collect()
    torch.cuda.empty_cache()


@pytest.mark.parametrize("label, backend, attention_config, dtype", TARGETS, ids=IDS)
@pytest.mark.parametrize("mode", ["graphs", "eager"])
def test_greedy_tokens_with_prefix_caching_on_and_off(label, backend, attention_config, dtype, mode, default_tokenizer):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA")
    if mode == "eager" and dtype == torch.float32:
        pytest.skip("eager runs in bfloat16 only")
    llm = _engine(
        backend, attention_config, dtype, enforce_eager=mode == "eager", kv_cache_memory=2 << 30, max_num_seqs=16
    )
    try:
        _cases(label, dtype, mode, llm, default_tokenizer)
    finally:
        _release(llm)


@pytest.mark.parametrize("label, backend, attention_config, dtype", TARGETS, ids=IDS)
def test_preemption_and_chunked_prefill_with_prefix_caching(label, backend, attention_config, dtype, default_tokenizer):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA")
    # 40 blocks of 16 tokens for six ~165-token prompts and their answers: preemption; 64-token steps: chunks
    llm = _engine(backend, attention_config, dtype, num_gpu_blocks=40, max_num_batched_tokens=64, max_num_seqs=8)
    try:
        prompts = _prompts(default_tokenizer)["shared prefix batch"]
        _check(label, dtype, "tiny KV, 64-token steps", llm, prompts, "preemption + chunked prefill")
    finally:
        _release(llm)
