"""The logits processors on the default model's logits: each rule equals a plain-PyTorch reference exactly
(repetition penalty also transformers' RepetitionPenaltyLogitsProcessor), a mixed batch gives each row what it
gets alone, the device token counts follow the samples, and the prompt-logprobs plan's rows across chunks."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from attnserve.core.sampling_params import SamplingParams
from attnserve.core.step import ScheduledRequest, SchedulerOutput
from attnserve.model_executor.logits_processors import LogitsProcessors
from attnserve.model_executor.prompt_logprobs import PromptLogprobsPlan

EOS = 2
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, there"]


@pytest.fixture(scope="module")
def logits(default_llm) -> torch.Tensor:  # (3, V) float32: the default model's next-token logits of PROMPTS
    runner = default_llm.engine.runner
    bs, reqs, nxt = runner.block_size, [], 0
    for i, p in enumerate(PROMPTS):
        ids = default_llm.tokenizer.encode(p)
        nb = -(-len(ids) // bs)
        reqs.append(ScheduledRequest(f"p{i}", ids, 0, list(range(nxt, nxt + nb)), SamplingParams(temperature=0), True))
        nxt += nb
    out = runner.compute_logits(SchedulerOutput(reqs))
    default_llm.reset_prefix_cache()  # those blocks were written outside the block manager
    return out


def _req(rid: str, prompt: list[int], output: list[int], **params) -> ScheduledRequest:
    bad_words_ids = params.pop("bad_words_ids", None)
    sp = SamplingParams(temperature=0, max_tokens=1000, **params)
    sp.bad_words_token_ids = bad_words_ids
    return ScheduledRequest(
        rid,
        [(prompt + output)[-1]],
        len(prompt) + len(output) - 1,
        [],
        sp,
        True,
        num_output_tokens=len(output),
        eos_token_id=EOS,
        prompt_token_ids=prompt,
        output_token_ids=output,
        recent_output_ids=output[-4:],
    )


def _apply(reqs, logits, last=(None, {})):
    lp = LogitsProcessors(logits.device)
    lp.admit(reqs, logits.shape[1])
    return lp(logits, reqs, *last), lp


def _ref_penalties(
    row: torch.Tensor, prompt, output, presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0
) -> torch.Tensor:
    """vLLM's rules, token by token."""
    row = row.clone()
    rep = torch.tensor(repetition_penalty, dtype=torch.float32)
    for t in set(prompt) | set(output):
        row[t] = row[t] / rep if row[t] > 0 else row[t] * rep
    f = torch.tensor(frequency_penalty, dtype=torch.float32)
    p = torch.tensor(presence_penalty, dtype=torch.float32)
    for t, c in Counter(output).items():
        row[t] = row[t] - f * c
    for t in set(output):
        row[t] = row[t] - p
    return row


PROMPT = [5, 17, 17, 300, 4000, 12, 5]
OUTPUT = [17, 900, 900, 900, 12, 31000, 17]


@pytest.mark.parametrize(
    "params",
    [
        dict(presence_penalty=1.5),
        dict(presence_penalty=-0.75),
        dict(frequency_penalty=0.5),
        dict(frequency_penalty=-2.0),
        dict(repetition_penalty=1.25),
        dict(repetition_penalty=0.5),
        dict(presence_penalty=0.25, frequency_penalty=1.0, repetition_penalty=1.5),
    ],
)
def test_each_penalty_equals_the_reference_exactly(logits, params):
    row = logits[1:2]
    out, _ = _apply([_req("a", PROMPT, OUTPUT, **params)], row)
    assert torch.equal(out[0], _ref_penalties(row[0], PROMPT, OUTPUT, **params))
    assert not torch.equal(out, row)


@pytest.mark.parametrize("penalty", [1.3, 0.7, 2.0])
def test_repetition_penalty_equals_transformers(logits, penalty):
    from transformers import RepetitionPenaltyLogitsProcessor

    row = logits[0:1]
    out, _ = _apply([_req("a", PROMPT, OUTPUT, repetition_penalty=penalty)], row)
    expected = RepetitionPenaltyLogitsProcessor(penalty)(torch.tensor([PROMPT + OUTPUT]), row.clone())
    assert torch.equal(out, expected)


def test_a_mixed_batch_gives_each_row_what_it_gets_alone(logits):
    reqs = [
        _req("a", PROMPT, OUTPUT, frequency_penalty=0.5, repetition_penalty=1.2),
        _req("b", [7, 8], [9]),
        _req("c", [1, 2, 3], [3, 3], presence_penalty=1.0, logit_bias={11: 3.5}, min_tokens=4),
    ]
    together, _ = _apply(reqs, logits)
    for i, r in enumerate(reqs):
        alone, _ = _apply([r], logits[i : i + 1])
        assert torch.equal(together[i], alone[0])
    assert torch.equal(together[1], logits[1])  # no rule: untouched
    assert torch.equal(
        together[0], _ref_penalties(logits[0], PROMPT, OUTPUT, frequency_penalty=0.5, repetition_penalty=1.2)
    )


def test_the_counts_follow_the_samples_on_the_device(logits):
    r = _req("a", PROMPT, OUTPUT, presence_penalty=0.5, frequency_penalty=0.25)
    lp = LogitsProcessors(logits.device)
    lp.admit([r], logits.shape[1])
    lp.record([r], torch.tensor([900]))  # the step's sample, as the runner records it
    lp.record([r], torch.tensor([44]))
    r.num_output_tokens += 2
    out = lp(logits[2:3], [r], None, {})
    assert torch.equal(out[0], _ref_penalties(logits[2], PROMPT, OUTPUT + [900, 44], 0.5, 0.25))
    lp.free(["a"])  # a finished or preempted request gives its slot back; a new one starts from its own tokens
    r2 = _req("b", [1], [], presence_penalty=0.5)
    lp.admit([r2], logits.shape[1])
    assert lp.slots["b"] == 0 and lp.counts[0].sum() == 0


def test_logit_bias_adds_to_the_logits(logits):
    out, _ = _apply([_req("a", [1], [], logit_bias={3: 2.5, 4000: -100.0})], logits[:1])
    ref = logits[0].clone()
    ref[3] += 2.5
    ref[4000] += -100.0
    assert torch.equal(out[0], ref)


def test_min_tokens_masks_eos_and_stop_ids_until_reached(logits):
    short, _ = _apply([_req("a", [1], [5, 6], min_tokens=3, stop_token_ids=[7, 8])], logits[:1])
    assert short[0, [EOS, 7, 8]].isneginf().all()
    ref = logits[0].clone()
    ref[[EOS, 7, 8]] = float("-inf")
    assert torch.equal(short[0], ref)
    reached, _ = _apply([_req("a", [1], [5, 6, 7], min_tokens=3, stop_token_ids=[7, 8])], logits[:1])
    assert torch.equal(reached[0], logits[0])
    no_eos, _ = _apply([_req("a", [1], [], min_tokens=3, ignore_eos=True)], logits[:1])
    assert torch.equal(no_eos[0], logits[0])  # ignore_eos: EOS is not a stop, nothing to mask


def test_allowed_token_ids_keep_only_those(logits):
    out, _ = _apply([_req("a", [1], [], allowed_token_ids=[10, 20, 4000])], logits[:1])
    keep = torch.zeros_like(out[0], dtype=torch.bool)
    keep[[10, 20, 4000]] = True
    assert torch.equal(out[0][keep], logits[0][keep]) and out[0][~keep].isneginf().all()


def test_bad_words_ban_the_last_token_after_the_prefix(logits):
    words = [[77], [5, 6, 88], [6, 99], [3, 6, 55], [9, 9, 9, 66]]
    out, _ = _apply([_req("a", [1], [3, 5, 6], bad_words=["x"], bad_words_ids=words)], logits[:1])
    assert out[0].isneginf().nonzero().flatten().tolist() == [77, 88, 99]
    ref = logits[0].clone()
    ref[[77, 88, 99]] = float("-inf")
    assert torch.equal(out[0], ref)


@pytest.mark.parametrize("pending_token, banned", [(6, [77, 88, 99]), (7, [77])])
def test_bad_words_compare_the_pending_token_on_the_device(logits, pending_token, banned):
    """Async scheduling: the output's last token is the last step's sample, not yet on the host."""
    words = [[77], [5, 6, 88], [6, 99], [3, 6, 55]]
    r = _req("a", [1], [3, 5], bad_words=["x"], bad_words_ids=words)
    r.num_output_tokens, r.output_pending = 3, True  # outputs 3, 5 known, the third in flight
    last = (torch.tensor([123, pending_token]), {"other": 0, "a": 1})
    out, _ = _apply([r], logits[:1], last)
    assert out[0].isneginf().nonzero().flatten().tolist() == banned


def test_prompt_logprobs_plan_rows_and_targets_across_chunks():
    prompt = list(range(100, 110))  # 10 tokens: entries for tokens 1..9, from positions 0..8
    sp = SamplingParams(prompt_logprobs=2)
    other = ScheduledRequest("d", [7], 20, [], SamplingParams(), True)
    first = ScheduledRequest("a", prompt[:4], 0, [], sp, False, prompt_token_ids=prompt)
    plan = PromptLogprobsPlan.of(SchedulerOutput([other, first]))
    assert plan.token_index.tolist() == [1, 2, 3, 4] and plan.targets.tolist() == prompt[1:5]
    assert plan.spans == [("a", 0, 4, 2)]
    last = ScheduledRequest("a", prompt[4:], 4, [], sp, True, prompt_token_ids=prompt)
    plan = PromptLogprobsPlan.of(SchedulerOutput([last]))
    assert plan.token_index.tolist() == [0, 1, 2, 3, 4] and plan.targets.tolist() == prompt[5:]
    assert plan.spans == [("a", 4, 5, 2)]
    assert PromptLogprobsPlan.of(SchedulerOutput([other])) is None
    assert isinstance(plan.token_index, np.ndarray)
