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


class CleaningTokenizer(SlowTokenizer):
    """The default tokenizer whose decode also cleans up spaces before punctuation (as Hugging Face's pass)."""

    clean_up_tokenization_spaces = True

    def __init__(self, tokenizer) -> None:
        super().__init__(tokenizer)
        self.backend_tokenizer = tokenizer.backend_tokenizer

    def decode(self, ids, skip_special_tokens=True):
        return super().decode(ids, skip_special_tokens).replace(" .", ".").replace(" ,", ",")


def test_a_tokenizer_that_cleans_up_spaces_decodes_through_itself(default_tokenizer):
    slow = CleaningTokenizer(default_tokenizer)  # its decode does more than the Rust decode
    assert IncrementalDetokenizer(slow, [1, 2], True)._backend_decode is None
    # a tokenizer that says it cleans up but whose decode is the Rust one's (transformers 5 skips it for BPE)
    says = SlowTokenizer(default_tokenizer)
    says.backend_tokenizer, says.clean_up_tokenization_spaces = default_tokenizer.backend_tokenizer, True
    assert IncrementalDetokenizer(says, [1, 2], True)._backend_decode is not None


def _wordpiece(clean_up: bool):
    """A fast WordPiece tokenizer (BERT's kind: Hugging Face's clean-up pass applies to it)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["[UNK]", "a", "b", "c", "d", "e", "f", "g", "h", "i", "j", ".", ",", "!", "?", "'", "s", "n", "t", "re"]
    words += ["ve", "m"]
    backend = Tokenizer(models.WordPiece({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.WordPiece(cleanup=False)  # the clean-up left to the wrapper
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", clean_up_tokenization_spaces=clean_up)


def test_fast_path_only_where_decode_adds_no_clean_up(default_tokenizer):
    from attnserve.engine.detokenizer import backend_decode_is_exact

    cleaned, plain = _wordpiece(True), _wordpiece(False)
    ids = cleaned.backend_tokenizer.encode("a . b , c", add_special_tokens=False).ids
    assert cleaned.decode(ids) == "a. b, c" and cleaned.backend_tokenizer.decode(ids) == "a . b , c"
    assert not backend_decode_is_exact(cleaned) and IncrementalDetokenizer(cleaned, [], True)._backend_decode is None
    assert backend_decode_is_exact(plain) and IncrementalDetokenizer(plain, [], True)._backend_decode is not None
    assert backend_decode_is_exact(default_tokenizer)
    assert not backend_decode_is_exact(SlowTokenizer(default_tokenizer))  # no Rust backend
