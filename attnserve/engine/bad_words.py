"""``bad_words`` as token id sequences (vLLM's ``SamplingParams.update_from_tokenizer``)."""

from __future__ import annotations

from attnserve.core.sampling_params import SamplingParamsError
from attnserve.refusals.sampling import BAD_WORD


def bad_words_token_ids(tokenizer, bad_words: list[str]) -> list[list[int]]:
    """Each word tokenized without special tokens, as written (its leading spaces removed) and, where that gives
    another first token and as many tokens, after a space: a word is banned at the start of the text and inside
    it. Raises SamplingParamsError for a word that tokenizes to nothing."""
    out: list[list[int]] = []
    for i, word in enumerate(bad_words):
        for add_prefix_space in (False, True):
            ids = tokenizer.encode((" " if add_prefix_space else "") + word.lstrip(), add_special_tokens=False)
            if not ids:
                raise SamplingParamsError("bad_words", word, BAD_WORD, index=i)
            if not add_prefix_space or (ids[0] != out[-1][0] and len(ids) == len(out[-1])):
                out.append(ids)
    return out
