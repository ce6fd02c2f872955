"""Incremental detokenization: text deltas as tokens arrive, without re-decoding the whole output.

The prefix/read-offset method of Hugging Face TGI and vLLM (``detokenize_incrementally``): decode a short
window of recent tokens twice, with and without the new ones, and emit the difference; hold text back
while it ends in an incomplete UTF-8 sequence (U+FFFD).
"""

from __future__ import annotations

import weakref

# text whose decode a clean-up pass (Hugging Face's ``clean_up_tokenization``) would change at every pattern it edits
_CLEAN_UP_PROBE = "a . b , c ! d ? e 's f n't g 're h 've i 'm j"
_exact_backend_decode: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def backend_decode_is_exact(tokenizer) -> bool:
    """Whether a fast tokenizer's Rust decode (``backend_tokenizer.decode``) gives ``tokenizer.decode``'s text: the
    wrapper's one addition is the ``clean_up_tokenization_spaces`` pass, and it runs neither when the option is off
    nor where transformers skips it (5.x does for BPE models, with a warning on each call). Asked once per
    tokenizer: a probe whose decode the clean-up would change. False for a tokenizer without a Rust backend."""
    try:
        return _exact_backend_decode[tokenizer]
    except (KeyError, TypeError):
        pass
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        exact = False
    elif not getattr(tokenizer, "clean_up_tokenization_spaces", True):
        exact = True
    else:
        ids = backend.encode(_CLEAN_UP_PROBE, add_special_tokens=False).ids
        exact = tokenizer.decode(ids, skip_special_tokens=True) == backend.decode(ids, skip_special_tokens=True)
    try:
        _exact_backend_decode[tokenizer] = exact
    except TypeError:  # not weakly referable: asked again next time
        pass
    return exact


class IncrementalDetokenizer:
    """Per-request detokenizer state; ``step()`` returns the new text since the last call."""

    # how many already-emitted tokens to re-decode as context (covers multi-token characters and spaces)
    CONTEXT_TOKENS = 5

    def __init__(
        self,
        tokenizer,
        prompt_token_ids: list[int],
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        # Hugging Face's decode option: a slow (Python) tokenizer honours it, a fast one has no such pass (as in vLLM)
        self.spaces_between_special_tokens = spaces_between_special_tokens
        if backend_decode_is_exact(tokenizer):
            # a fast tokenizer whose decode adds no clean-up pass: the Rust decode, called directly at a third of
            # the cost (two decodes per token per request, each step)
            self._backend_decode = tokenizer.backend_tokenizer.decode
        self.token_ids = list(prompt_token_ids[-self.CONTEXT_TOKENS :])
        self.prefix_offset = 0
        self.read_offset = len(self.token_ids)
        self.text = ""

    _backend_decode = None

    def _decode(self, ids: list[int]) -> str:
        if self._backend_decode is not None:
            return self._backend_decode(ids, skip_special_tokens=self.skip_special_tokens)
        if not self.spaces_between_special_tokens:
            return self.tokenizer.decode(
                ids, skip_special_tokens=self.skip_special_tokens, spaces_between_special_tokens=False
            )
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def step(self, new_token_ids: list[int]) -> str:
        """Add tokens; return the text they complete (possibly empty) and append it to ``self.text``."""
        self.token_ids.extend(new_token_ids)
        prefix_text = self._decode(self.token_ids[self.prefix_offset : self.read_offset])
        new_text = self._decode(self.token_ids[self.prefix_offset :])
        if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd"):
            return ""
        delta = new_text[len(prefix_text) :]
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.token_ids)
        self.text += delta
        return delta

    def flush(self) -> str:
        """At the end of a request: emit whatever was held back (e.g. a trailing partial character)."""
        rest = self._decode(self.token_ids[self.prefix_offset :])
        prefix_text = self._decode(self.token_ids[self.prefix_offset : self.read_offset])
        delta = rest[len(prefix_text) :] if rest.startswith(prefix_text) else ""
        self.read_offset = len(self.token_ids)
        self.prefix_offset = self.read_offset
        self.text += delta
        return delta
