"""What the engine checks of a request before it queues it (vLLM v1's ``InputProcessor`` validation): the
SamplingParams against this model and engine, and each prompt (tokenized, truncated, fitted to the context and
the KV cache). The words are ``request_checks``' and ``refusals``'; :class:`LLMEngine` exposes these checks
as its own methods, which the server, ``LLM`` and ``attnserve generate`` call before queueing anything.
"""

from __future__ import annotations

from collections.abc import Callable

from attnserve.core.sampling_params import SamplingParams, SamplingParamsError
from attnserve.engine.bad_words import bad_words_token_ids
from attnserve.engine.request_checks import (
    EMPTY_PROMPT,
    RequestValueError,
    check_context_length,
    check_not_empty,
    check_token_ids,
    token_id_words,
)
from attnserve.refusals import Refused
from attnserve.refusals.sampling import (
    lone_surrogate_in_prompt,
    max_logprobs_words,
    token_ids_as_keys,
    truncate_over_max_model_len_words,
)
from attnserve.refusals.requests import THE_PROMPT


def prompt_name(path: tuple[str | int, ...]) -> str:
    """How a context-length error names the prompt at ``path``: ``the prompt`` for the one prompt of a call,
    else its place (``prompts[1]``, ``messages[1]``)."""
    return THE_PROMPT if len(path) == 1 else RequestValueError(path, None, "").where


class InputChecks:
    """A request's checks against one loaded model. ``max_logprobs``: ``--max-logprobs`` (-1: the vocabulary
    size); ``prompt_fits``: raises when a prompt of that many tokens can never be scheduled
    (``Scheduler.check_prompt_fits``); ``compile_grammar``: compiles (and caches) a structured-outputs
    constraint, raising for an invalid one (``StructuredOutputManager.compile``)."""

    def __init__(
        self,
        tokenizer,
        vocab_size: int,
        max_model_len: int,
        max_logprobs: int,
        prompt_fits: Callable[[int], None],
        compile_grammar: Callable[[object], object],
    ) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.max_logprobs = vocab_size if max_logprobs == -1 else max_logprobs
        self.token_id_words = token_id_words(vocab_size)  # ``integer in [0, 49152), the vocabulary size``
        self._prompt_fits = prompt_fits
        self._compile_grammar = compile_grammar

    def check_params(self, params: SamplingParams) -> None:
        """Check what SamplingParams alone cannot: its values against this model and engine. Raises
        SamplingParamsError (a ValueError) for more logprobs (or prompt_logprobs) than ``--max-logprobs`` allows,
        ``logprobs 21 not allowed (allowed: integer in [0, 20], the engine's max_logprobs)``, and for a stop token
        id outside the vocabulary, naming the first bad one and its index: ``stop_token_ids 50000 not allowed
        (allowed: integer in [0, 49152), the vocabulary size)``; the same for ``allowed_token_ids`` and
        ``logit_bias``' keys, and for a ``truncate_prompt_tokens`` over max_model_len (as vLLM); it also tokenizes
        ``bad_words`` (``bad_words_token_ids``) and compiles a structured-outputs constraint (an invalid one is refused
        here)."""
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(params, name, None)
            if value is not None and value > self.max_logprobs:
                raise SamplingParamsError(name, value, max_logprobs_words(self.max_logprobs))
        t = params.truncate_prompt_tokens
        if t is not None and t > self.max_model_len:  # vLLM refuses it too: no prompt that long is taken
            raise SamplingParamsError(
                "truncate_prompt_tokens", t, truncate_over_max_model_len_words(self.max_model_len)
            )
        for name in ("stop_token_ids", "allowed_token_ids"):
            ids = getattr(params, name) or []
            bad = next((i for i, t in enumerate(ids) if t >= self.vocab_size), None)
            if bad is not None:
                raise SamplingParamsError(name, ids[bad], self.token_id_words, index=bad)
        bad = next((t for t in (params.logit_bias or {}) if t >= self.vocab_size), None)
        if bad is not None:
            raise SamplingParamsError("logit_bias", bad, token_ids_as_keys(self.token_id_words))
        if params.bad_words and params.bad_words_token_ids is None:
            params.bad_words_token_ids = bad_words_token_ids(self.tokenizer, params.bad_words)
        if params.structured_outputs is not None:  # compiled once here (cached)
            self._compile_grammar(params.structured_outputs)

    def tokenize(self, prompt: str | list[int], path: tuple[str | int, ...] = ("prompt",)) -> list[int]:
        """The prompt's token ids (token ids as given). Raises Refused for text holding a lone surrogate
        (``"\\ud800"``: no Unicode character; the tokenizer would raise a TypeError), naming the prompt by ``path``."""
        if not isinstance(prompt, str):
            return list(prompt)
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError as e:
            raise Refused(lone_surrogate_in_prompt(path, prompt, e.start)) from None
        return self.tokenizer.encode(prompt)

    def check_prompt(
        self,
        prompt: str | list[int],
        path: tuple[str | int, ...] = ("prompt",),
        truncate_prompt_tokens: int | None = None,
    ) -> list[int]:
        """Tokenize ``prompt`` and check that it fits; returns its token ids. ``path`` names the prompt in errors
        (``("prompts", 1)``: the second of a batch); the checks and their words are ``request_checks``', which the
        server and the CLI use too.

        Raises RequestValueError (a ValueError: an empty prompt, ``prompt '' not allowed (allowed: a prompt of at
        least 1 token)``; a token id that is not an integer in [0, vocab_size), named by its position,
        ``prompt[2]``), PromptTooLongError (a prompt of max_model_len tokens or more), or the scheduler's ConfigError
        (a ValueError keyed to the setting: a prompt the KV cache cannot hold, or, with chunked prefill off, over
        max_num_batched_tokens). ``truncate_prompt_tokens`` (SamplingParams'): the prompt's last tokens only.
        """
        check_not_empty(prompt, path)  # before tokenizing: a tokenizer may turn "" into a lone BOS token
        token_ids = self.truncate(self.tokenize(prompt, path), truncate_prompt_tokens)
        if not token_ids:  # text that tokenizes to nothing
            raise RequestValueError(path, prompt, EMPTY_PROMPT)
        check_token_ids(token_ids, self.vocab_size, path)
        check_context_length(len(token_ids), None, self.max_model_len, prompt_name(path))
        self._prompt_fits(len(token_ids))
        return token_ids

    def truncate(self, token_ids: list[int], truncate_prompt_tokens: int | None) -> list[int]:
        """vLLM's ``truncate_prompt_tokens``: the last k tokens (k = -1: max_model_len); None: all of them."""
        if truncate_prompt_tokens is None:
            return token_ids
        k = self.max_model_len if truncate_prompt_tokens == -1 else truncate_prompt_tokens
        return token_ids[-k:]

    def check_max_tokens(
        self, num_prompt_tokens: int, params: SamplingParams, path: tuple[str | int, ...] = ("prompt",)
    ) -> None:
        """Raise MaxTokensTooLargeError when a checked prompt of ``num_prompt_tokens`` tokens and
        ``params.max_tokens`` more exceed max_model_len (the server's rule and words: ``request_checks``);
        ``params.max_tokens`` None (up to max_model_len) always fits."""
        check_context_length(num_prompt_tokens, params.max_tokens, self.max_model_len, prompt_name(path))
