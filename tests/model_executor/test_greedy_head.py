"""The sampler's greedy-head strategy without a GPU: which steps take a fused head's tokens, and the GEMV plan's
fused head looking up its table by row count (the kernel itself: tests/gpu/test_greedy_head_gpu.py)."""

from __future__ import annotations

import torch

import pytest

from attnserve.core.sampling_params import SamplingParams, StructuredOutputsParams
from attnserve.gemv.methods import FusedGreedyHead
from attnserve.layers.embedding import ParallelLMHead
from attnserve.model_executor.greedy_head import GreedyHead

GREEDY = SamplingParams(temperature=0.0)


def test_without_a_fused_head_every_step_computes_its_logits():
    assert GreedyHead().tokens(torch.zeros(2, 4), [GREEDY, GREEDY]) is None


class _Fused:
    """A fused head over 2 rows only, recording the calls: (rows, grammar)."""

    def __init__(self) -> None:
        self.calls = []

    def covers(self, rows: int) -> bool:
        return rows == 2

    def __call__(self, hidden, grammar=None):
        self.calls.append((hidden.shape[0], grammar))
        return torch.zeros(hidden.shape[0], dtype=torch.int64)


def test_only_steps_of_plain_greedy_rows_take_the_fused_head():
    fused = _Fused()
    head, hidden = GreedyHead(fused), torch.zeros(2, 4)
    assert torch.equal(head.tokens(hidden, [GREEDY, GREEDY]), torch.zeros(2, dtype=torch.int64))
    for other in (
        SamplingParams(temperature=0.5),
        SamplingParams(temperature=0.0, logprobs=1),
        SamplingParams(temperature=0.0, repetition_penalty=1.2),
        SamplingParams(temperature=0.0, logit_bias={3: 1.0}),
    ):
        assert not head.applies([GREEDY, other]) and head.tokens(hidden, [GREEDY, other]) is None, other
    assert not head.applies([GREEDY] * 3)  # a row count the head does not cover
    assert fused.calls == [(2, None)]


def test_a_constrained_greedy_step_takes_the_fused_head_with_its_bitmask():
    from attnserve.structured_output.bitmask import GrammarBitmask

    fused = _Fused()
    constrained = SamplingParams(temperature=0.0, structured_outputs=StructuredOutputsParams(regex="[a-z]+"))
    grammar = GrammarBitmask(torch.zeros(1, 1, dtype=torch.int32), None, 10, 2, index=torch.tensor([-1, 0]))
    assert GreedyHead(fused).applies([GREEDY, constrained])
    GreedyHead(fused).tokens(torch.zeros(2, 4), [GREEDY, constrained], grammar)
    assert fused.calls == [(2, grammar)]


def test_the_fused_head_takes_the_bitmask_through_its_row_index():
    from attnserve.structured_output.bitmask import GrammarBitmask

    lm = ParallelLMHead(10, 4)
    seen = []
    fused = FusedGreedyHead(lm, (None, None, lambda h, w, **mask: seen.append(mask) or torch.zeros(2)))
    words, index = torch.zeros(1, 1, dtype=torch.int32), torch.tensor([-1, 0], dtype=torch.int32)
    fused(torch.zeros(2, 4), GrammarBitmask(words, None, 7, 2, index=index))
    assert seen == [{"mask_words": words, "mask_index": index, "mask_tokens": 7}]
    with pytest.raises(ValueError, match="row index"):  # rows (the logits path's form) are not the head's
        fused(torch.zeros(2, 4), GrammarBitmask(words, torch.tensor([1]), 7, 2))


def test_row_index_inverts_the_rows():
    import numpy as np

    from attnserve.structured_output.bitmask import GrammarBitmask

    mask = GrammarBitmask(np.zeros((2, 1), np.int32), np.array([1, 4]), 10, 6)
    assert mask.row_index().tolist() == [-1, 0, -1, -1, 1, -1] and mask.row_index().dtype == np.int32


def test_fused_greedy_head_covers_the_row_counts_of_its_table():
    lm = ParallelLMHead(10, 4)
    lm.weight.data.normal_()
    argmax = lambda hidden, weight: (hidden @ weight.t()).argmax(-1)  # noqa: E731
    fused = FusedGreedyHead(lm, (None, argmax, None))  # rows 1 only
    hidden = torch.randn(1, 4)
    assert torch.equal(fused(hidden), lm.logits(hidden).argmax(-1))
    assert fused(torch.randn(2, 4)) is None and fused(torch.randn(5, 4)) is None
