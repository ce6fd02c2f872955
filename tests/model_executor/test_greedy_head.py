"""The sampler's greedy-head strategy without a GPU: which steps take a fused head's tokens, and the GEMV plan's
fused head looking up its table by row count (the kernel itself: tests/gpu/test_greedy_head_gpu.py)."""

from __future__ import annotations

import torch

from attnserve.core.sampling_params import SamplingParams
from attnserve.gemv.methods import FusedGreedyHead
from attnserve.layers.embedding import ParallelLMHead
from attnserve.model_executor.greedy_head import GreedyHead

GREEDY = SamplingParams(temperature=0.0)


def test_without_a_fused_head_every_step_computes_its_logits():
    assert GreedyHead().tokens(torch.zeros(2, 4), [GREEDY, GREEDY]) is None


def test_only_steps_of_plain_greedy_rows_take_the_fused_head():
    calls = []

    def fused(hidden):
        calls.append(hidden.shape[0])
        return torch.zeros(hidden.shape[0], dtype=torch.int64)

    head, hidden = GreedyHead(fused), torch.zeros(2, 4)
    assert torch.equal(head.tokens(hidden, [GREEDY, GREEDY]), torch.zeros(2, dtype=torch.int64))
    for other in (
        SamplingParams(temperature=0.5),
        SamplingParams(temperature=0.0, logprobs=1),
        SamplingParams(temperature=0.0, repetition_penalty=1.2),
        SamplingParams(temperature=0.0, logit_bias={3: 1.0}),
    ):
        assert head.tokens(hidden, [GREEDY, other]) is None, other
    assert calls == [2]


def test_fused_greedy_head_covers_the_row_counts_of_its_table():
    lm = ParallelLMHead(10, 4)
    lm.weight.data.normal_()
    argmax = lambda hidden, weight: (hidden @ weight.t()).argmax(-1)  # noqa: E731
    fused = FusedGreedyHead(lm, (None, argmax, None))  # rows 1 only
    hidden = torch.randn(1, 4)
    assert torch.equal(fused(hidden), lm.logits(hidden).argmax(-1))
    assert fused(torch.randn(2, 4)) is None and fused(torch.randn(5, 4)) is None
