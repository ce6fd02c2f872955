"""The default model (SmolLM2-135M-Instruct GGUF): our engine vs transformers on the same file, float32 CPU."""

from __future__ import annotations

import os

import pytest
import torch

from attnserve import SamplingParams
from attnserve.model_executor.loader import resolve_model_source
from tests.helpers import hf_greedy

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Write a haiku about the sea.",
    "1, 2, 3, 4,",
    "<|im_start|>user\nWhat is the boiling point of water in Celsius?<|im_end|>\n<|im_start|>assistant\n",
]
NEW_TOKENS = 32


@pytest.fixture(scope="module")
def hf_reference(default_llm):
    from transformers import AutoModelForCausalLM

    source = resolve_model_source(None)
    model = AutoModelForCausalLM.from_pretrained(
        source.folder, gguf_file=os.path.basename(source.path), dtype=torch.float32
    )
    model.eval()
    tok = default_llm.tokenizer
    return {p: hf_greedy(model, tok.encode(p), NEW_TOKENS) for p in PROMPTS}


GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)


def test_greedy_tokens_one_prompt_at_a_time(default_llm, hf_reference):
    for prompt in PROMPTS:
        out = default_llm.generate(prompt, GREEDY)[0]
        assert out.outputs[0].token_ids == hf_reference[prompt][0], prompt


def test_greedy_tokens_all_prompts_in_one_batch(default_llm, hf_reference):
    lengths = {len(default_llm.tokenizer.encode(p)) for p in PROMPTS}
    assert len(lengths) > 1  # prompts of different lengths share the batch
    outs = default_llm.generate(PROMPTS, GREEDY)
    for prompt, out in zip(PROMPTS, outs):
        assert out.outputs[0].token_ids == hf_reference[prompt][0], prompt


def test_last_position_logits_match(default_llm, hf_reference):
    from attnserve.engine.scheduler import ScheduledRequest, SchedulerOutput

    runner = default_llm.engine.runner
    reqs, start = [], 0
    for i, prompt in enumerate(PROMPTS):
        ids = default_llm.tokenizer.encode(prompt)
        n = -(-len(ids) // runner.block_size)
        table = list(range(start, start + n))
        start += n
        reqs.append(ScheduledRequest(str(i), ids, 0, table, GREEDY, True))
    logits = runner.compute_logits(SchedulerOutput(requests=reqs))
    for i, prompt in enumerate(PROMPTS):
        diff = (logits[i] - hf_reference[prompt][1]).abs().max().item()
        assert diff < 1e-3, (prompt, diff)


def test_chat_answers_with_the_chat_template(default_llm):
    out = default_llm.chat(
        [{"role": "user", "content": "What is the capital of France?"}], SamplingParams(temperature=0.0, max_tokens=16)
    )[0]
    tok = default_llm.tokenizer
    expected_prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], tokenize=False, add_generation_prompt=True
    )
    assert out.prompt_token_ids == tok.encode(expected_prompt, add_special_tokens=False)
    assert "Paris" in out.outputs[0].text
