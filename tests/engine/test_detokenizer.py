"""Incremental detokenization: the fast path (the Rust decode called directly) gives the text that
``tokenizer.decode`` gives, one token at a time."""

from __future__ import annotations

import random

import pytest

from attnserve.engine.detokenizer import IncrementalDetokenizer


class SlowTokenizer:
    """The default tokenizer seen without its backend: IncrementalDetokenizer must call ``decode``."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.calls = 0

    def decode(self, ids, skip_special_tokens=True):
        self.calls += 1
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


def run(tokenizer, ids: list[int], prompt_len: int, skip: bool) -> tuple[list[str], str]:
    d = IncrementalDetokenizer(tokenizer, ids[:prompt_len], skip)
    deltas = [d.step([t]) for t in ids[prompt_len:]]
    return deltas, "".join(deltas) + d.flush()


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_fast_path_equals_tokenizer_decode(default_tokenizer, skip_special_tokens):
    tok = default_tokenizer
    assert IncrementalDetokenizer(tok, [], True)._backend_decode is not None  # the fast path is taken
    rng = random.Random(0)
    text = "Héllo wörld, 東京 🎉 naïve café — ok.\n  spaces  and\ttabs " + tok.eos_token + " more"
    ids = tok.encode(text, add_special_tokens=False) + [rng.randrange(len(tok)) for _ in range(80)]
    slow = SlowTokenizer(tok)
    fast_deltas, fast_text = run(tok, ids, 5, skip_special_tokens)
    slow_deltas, slow_text = run(slow, ids, 5, skip_special_tokens)
    assert slow.calls > 0
    assert fast_deltas == slow_deltas and fast_text == slow_text
    assert tok.decode(ids[:5], skip_special_tokens=skip_special_tokens) + fast_text == tok.decode(
        ids, skip_special_tokens=skip_special_tokens
    )


def test_a_tokenizer_that_cleans_up_spaces_decodes_through_itself(default_tokenizer):
    slow = SlowTokenizer(default_tokenizer)
    slow.backend_tokenizer = default_tokenizer.backend_tokenizer
    slow.clean_up_tokenization_spaces = True  # its decode does more than the Rust decode
    assert IncrementalDetokenizer(slow, [1, 2], True)._backend_decode is None
