"""StructuredOutputsParams' checks, the missing-extra refusal and the device mask, without a model."""

from __future__ import annotations

import sys

import pytest
import torch

from attnserve.core.sampling_params import SamplingParams
from attnserve.core.structured_outputs import StructuredOutputsParams as S
from attnserve.refusals import Refused
from attnserve.structured_output.bitmask import GrammarBitmask, apply_grammar_bitmask


@pytest.mark.parametrize(
    "kwargs, path",
    [
        ({}, ("structured_outputs",)),
        ({"json": {}, "regex": "a"}, ("structured_outputs",)),
        ({"choice": []}, ("structured_outputs", "choice")),
        ({"choice": ["a", 1]}, ("structured_outputs", "choice")),
        ({"regex": 3}, ("structured_outputs", "regex")),
        ({"json_object": "yes"}, ("structured_outputs", "json_object")),
    ],
    ids=["none", "two", "empty_choice", "choice_not_str", "regex_not_str", "json_object_not_true"],
)
def test_exactly_one_constraint_of_its_type(kwargs, path):
    with pytest.raises(Refused) as e:
        S(**kwargs)
    assert e.value.path == path


@pytest.mark.parametrize("kwargs", [{}, {"json": {}, "regex": "a"}], ids=["none", "two"])
def test_not_one_kind_echoes_the_kinds_given(kwargs):
    with pytest.raises(Refused) as e:
        S(**kwargs)
    assert e.value.refusal.value == kwargs


def test_dict_form_and_unknown_key():
    p = SamplingParams(structured_outputs={"regex": "a+"})
    assert p.structured_outputs == S(regex="a+") and p.structured_outputs.kind == "regex"
    with pytest.raises(Refused) as e:
        SamplingParams(structured_outputs={"regex": "a+", "whitespace_pattern": " "})
    assert e.value.path == ("structured_outputs", "whitespace_pattern")
    assert e.value.refusal.value == " " and e.value.refusal.subject is None  # the message names the key by its path


def test_cache_key_of_a_schema_ignores_key_order():
    assert S(json={"a": 1, "b": 2}).source == S(json={"b": 2, "a": 1}).source


def test_without_xgrammar_the_refusal_names_the_extra(monkeypatch):
    from attnserve.structured_output.backend_xgrammar import import_xgrammar

    monkeypatch.setitem(sys.modules, "xgrammar", None)  # import fails as if not installed
    with pytest.raises(Refused) as e:
        import_xgrammar()
    assert e.value.path == ("structured_outputs",) and "attnserve[structured]" in str(e.value)


def _words(allowed: list[list[int]], width: int) -> torch.Tensor:
    mask = torch.zeros(len(allowed), width, dtype=torch.int32)
    for r, tokens in enumerate(allowed):
        for t in tokens:
            word = int(mask[r, t // 32]) | (1 << (t % 32))
            mask[r, t // 32] = word - (1 << 32) if word >= 1 << 31 else word  # int32 two's complement
    return mask


def test_bitmask_masks_exactly_the_cleared_bits():
    vocab = 70  # three 32-bit words, the last one partly past the vocabulary
    allowed = [[0, 31, 32, 69], list(range(vocab))]
    logits = torch.randn(2, vocab)
    out = apply_grammar_bitmask(logits.clone(), GrammarBitmask(_words(allowed, 3), None, vocab))
    assert torch.isinf(out[0]).sum() == vocab - 4 and torch.equal(out[0, allowed[0]], logits[0, allowed[0]])
    assert torch.equal(out[1], logits[1])
    assert apply_grammar_bitmask(logits, None) is logits


def test_bitmask_rows_and_padded_vocabulary():
    """Only the listed rows are masked; tokens past the grammar's vocabulary (the logits' padding) are never
    allowed in them, even where a row's last word has bits set past it."""
    vocab, tokens = 100, 40  # the grammar engine covers 40 tokens: two words
    logits = torch.randn(4, vocab)
    mask = GrammarBitmask(_words([[1, 39, 63], list(range(64))], 2), torch.tensor([1, 3]), tokens)
    out = apply_grammar_bitmask(logits.clone(), mask)
    assert torch.equal(out[[0, 2]], logits[[0, 2]])
    assert torch.isfinite(out[1]).nonzero().flatten().tolist() == [1, 39]
    assert torch.isfinite(out[3]).nonzero().flatten().tolist() == list(range(tokens))
    assert torch.equal(out[3, :tokens], logits[3, :tokens])
