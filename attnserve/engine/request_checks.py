"""A request's prompt checks, worded once for every surface: ``LLM.generate`` / ``LLM.chat``, the OpenAI server and
``attnserve generate`` refuse the same mistakes with the same words.

Each refusal is an exception that knows where the bad value is and what is allowed; a surface only spells the
place and the value in its own language: Python indexes (``prompt[2] 50000 not allowed (allowed: integer in [0,
49152), the vocabulary size)``), the server writes the path dotted as its ``param`` with the value as JSON
(``prompt.2: 50000 not allowed (...)``), the CLI names the flag (``argument --prompt: '' not allowed (...)``).
The context-length refusals keep OpenAI's wording (``This model's maximum context length is ...``), which
OpenAI clients and tools look for to tell a context overflow from other 400s.
"""

from __future__ import annotations

import operator
from array import array

import numpy as np

from attnserve.config.fields import ConfigError
from attnserve.refusals import MISSING, Refusal, Refused, dotted_path, python_path
from attnserve.refusals.requests import (  # noqa: F401 (EMPTY_PROMPT re-exported)
    EMPTY_PROMPT,
    max_tokens_too_large,
    prompt_too_long,
    token_id_words,
)


class RequestValueError(Refused):
    """A request value outside its allowed values, at ``path``: the parameter and the indexes or keys into it
    (``("prompt", 2)``: token 2 of the prompt; ``("messages", 1, 0, "content")``). ``value`` is the value refused
    (``RequestValueError.MISSING`` for a required key that is absent); ``allowed`` says what is allowed, in words;
    ``noun`` (``"a list"``), when given, says what the value is not, for a value of the wrong kind.

    ``str()`` is Python's message: ``prompt[2] 50000 not allowed (allowed: ...)``, ``messages 'hi' is not a list
    (allowed: ...)``, ``messages[0].content missing (required: ...)``; the server writes the record with
    :func:`attnserve.refusals.openai_error` (``prompt.2: 50000 not allowed (...)``)."""

    MISSING = MISSING

    __reduce__ = Refused.reduce_from_record

    def __init__(self, path: tuple[str | int, ...], value: object, allowed: str, noun: str | None = None) -> None:
        super().__init__(Refusal(tuple(path), value, allowed, noun=noun))

    @property
    def where(self) -> str:
        """The place as Python indexes it: ``prompt[2]``, ``messages[1][0].content``."""
        return python_path(self.path)

    @property
    def param(self) -> str:
        """The place as the server's ``param`` writes it: ``prompt.2``, ``messages.1.0.content``."""
        return dotted_path(self.path)


class PromptTooLongError(ConfigError):
    """A prompt that alone leaves no room for a generated token within max_model_len (OpenAI's wording, which
    names the context length). A ConfigError keyed ``max_model_len``: the CLI names ``--max-model-len``; the
    server answers 400 with ``param`` the prompt's path (``prompt``, ``prompt.1``, ``messages``)."""

    __reduce__ = Refused.reduce_from_record

    def __init__(self, num_prompt_tokens: int, max_model_len: int, prompt: str = "the prompt") -> None:
        self.num_prompt_tokens, self.max_model_len = num_prompt_tokens, max_model_len
        super().__init__(prompt_too_long(num_prompt_tokens, max_model_len, prompt))


class MaxTokensTooLargeError(Refused):
    """A prompt that fits, but not with ``max_tokens`` more tokens: prompt tokens + max_tokens > max_model_len.
    OpenAI's wording (and the server's, which answers 400 with ``param`` the max-tokens field the request set)."""

    __reduce__ = Refused.reduce_from_record

    def __init__(self, num_prompt_tokens: int, max_tokens: int, max_model_len: int, prompt: str = "the prompt") -> None:
        self.num_prompt_tokens, self.max_tokens, self.max_model_len = num_prompt_tokens, max_tokens, max_model_len
        super().__init__(max_tokens_too_large(num_prompt_tokens, max_tokens, max_model_len, prompt))


def check_not_empty(prompt: str | list, path: tuple[str | int, ...] = ("prompt",)) -> None:
    """Raise RequestValueError for an empty prompt (``""``, ``[]``), at ``path``. Checked before tokenizing: a
    tokenizer may turn ``""`` into a lone BOS token."""
    if len(prompt) == 0:
        raise RequestValueError(path, prompt, EMPTY_PROMPT)


def check_token_ids(token_ids: list, vocab_size: int, path: tuple[str | int, ...] = ("prompt",)) -> None:
    """Raise RequestValueError for the first token id that is not an integer in [0, vocab_size), at its
    position: ``prompt[2] 50000 not allowed (allowed: integer in [0, 49152), the vocabulary size)``. An integer is
    what ``operator.index`` takes (int, numpy's integers), except ``bool``."""
    if token_ids and _all_in_range(token_ids, vocab_size):
        return
    for i, t in enumerate(token_ids):
        if not _is_token_id(t, vocab_size):
            raise RequestValueError((*path, i), t, token_id_words(vocab_size))


def _all_in_range(token_ids: list, vocab_size: int) -> bool:
    """The common case in C passes (a 2k-token prompt: ~50 us; Python's min and max and a type set took ~150, and
    a benchmark's 256 prompts wait for all of them before the first step): one conversion to int64, which refuses
    every non-integer but bool, then the range, then the type of the few ids that could be a bool (0 and 1)."""
    try:
        ids = np.frombuffer(array("q", token_ids), dtype=np.int64)
    except (TypeError, OverflowError):
        return False
    if ids.min() < 0 or ids.max() >= vocab_size:
        return False
    return not any(type(token_ids[i]) is bool for i in np.flatnonzero(ids <= 1).tolist())


def _is_token_id(t, vocab_size: int) -> bool:
    if isinstance(t, bool):
        return False
    try:
        return 0 <= operator.index(t) < vocab_size
    except TypeError:
        return False


def check_context_length(
    num_prompt_tokens: int, max_tokens: int | None, max_model_len: int, prompt: str = "the prompt"
) -> int:
    """The max_tokens a request gets (None: the rest of the context, ``max_model_len - num_prompt_tokens``).

    Raises PromptTooLongError when the prompt alone has max_model_len tokens or more (no room for one generated
    token), MaxTokensTooLargeError when prompt tokens + ``max_tokens`` exceed max_model_len: refused, not cut
    short at max_model_len, so that a request gets the tokens it asked for or an error saying why it cannot.
    ``prompt`` names the prompt in the message (``prompts[1]`` in a batch)."""
    if num_prompt_tokens >= max_model_len:
        raise PromptTooLongError(num_prompt_tokens, max_model_len, prompt)
    if max_tokens is None:
        return max_model_len - num_prompt_tokens
    if num_prompt_tokens + max_tokens > max_model_len:
        raise MaxTokensTooLargeError(num_prompt_tokens, max_tokens, max_model_len, prompt)
    return max_tokens
