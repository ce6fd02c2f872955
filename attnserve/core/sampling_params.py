"""SamplingParams: how one request's tokens are chosen and when it stops (vLLM's field names)."""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field

from attnserve.config.model import SEED_MAX, SEED_MIN
from attnserve.refusals import Refusal, Refused
from attnserve.refusals.sampling import (  # noqa: F401 (ALLOWED re-exported)
    ALLOWED,
    ITEMS,
    LOGIT_BIAS_KEYS,
    LOGIT_BIAS_VALUES,
    STOP_NEEDS_TEXT,
    TRUE_OR_FALSE,
)
from attnserve.core.structured_outputs import StructuredOutputsParams

MAX_LOGPROBS = 20  # the default of the engine's max_logprobs (--max-logprobs, vLLM's default), checked there


def _is_int(x) -> bool:  # int or numpy integer, not bool
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_real(x) -> bool:  # finite int or float (numpy's too), not bool
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


# the options that are on or off
_BOOL_FIELDS = (
    "ignore_eos",
    "include_stop_str_in_output",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "detokenize",
)


def completion_seed(seed: int, i: int) -> int:
    """The seed of completion ``i`` of a request seeded ``seed``: ``seed + i``, wrapped into the seed range [-2^63,
    2^63 - 1] as 64-bit integers wrap (2^63 - 1 + 1 is -2^63, the seed torch reads for 2^63), so that every seed in
    the range works with every n (vLLM seeds completion i with seed + i too)."""
    return (seed + i - SEED_MIN) % 2**64 + SEED_MIN


class SamplingParamsError(Refused):
    """A sampling parameter outside its allowed values: its ``name`` (``"stop"``), the ``value`` refused (for a
    list parameter, the first bad item, at ``index``) and the ``allowed`` values in words. The record's path is the
    parameter, and the item's index for a list's item: ``stop[1] '' not allowed (allowed: non-empty strings)``, the
    server's ``param`` ``stop.1``."""

    __reduce__ = Refused.reduce_from_record

    def __init__(self, name: str, value: object, allowed: str, index: int | None = None) -> None:
        self.name, self.index = name, index
        super().__init__(Refusal((name,) if index is None else (name, index), value, allowed))


@dataclass
class SamplingParams:
    """Per-request sampling and stopping parameters. Validated at construction.

    temperature 0 means greedy (argmax). Filters apply in the order top-k, top-p, min-p (vLLM's order).
    """

    n: int = 1  # completions per prompt
    temperature: float = 1.0
    top_p: float = 1.0  # keep the smallest set of tokens whose probability sums to >= top_p
    top_k: int = 0  # keep the k most likely tokens; 0 or -1 = all
    min_p: float = 0.0  # drop tokens less likely than min_p * p(most likely)
    seed: int | None = None  # per-request random seed, an integer in [-2^63, 2^63 - 1]; completion i uses seed + i
    max_tokens: int | None = 16  # None = up to max_model_len
    stop: list[str] = field(default_factory=list)  # stop strings, not included in the output text; None = []
    stop_token_ids: list[int] = field(default_factory=list)  # None = [] (vLLM's default is None)
    ignore_eos: bool = False
    logprobs: int | None = None  # number of top logprobs per generated token (the sampled one is added)
    # number of top logprobs per prompt token (the prompt's own token is added; the first token has none)
    prompt_logprobs: int | None = None
    # penalties, vLLM's (OpenAI's definition for presence/frequency): on the logits before temperature, over the
    # tokens generated so far; repetition_penalty also over the prompt's tokens (> 0: positive logits divided
    # by it, negative ones multiplied)
    presence_penalty: float = 0.0  # subtracted once from every token that occurs in the output, [-2, 2]
    frequency_penalty: float = 0.0  # subtracted once per occurrence in the output, [-2, 2]
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit; None = {}
    min_tokens: int = 0  # EOS and stop_token_ids are masked (and stop strings not matched) before this many tokens
    bad_words: list[str] | None = None  # words never generated (as a token sequence, with and without a space)
    allowed_token_ids: list[int] | None = None  # only these tokens may be generated; None = all
    include_stop_str_in_output: bool = False  # the stop string that ended the output stays in its text
    truncate_prompt_tokens: int | None = None  # keep the prompt's last k tokens (-1: max_model_len); None = all
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True  # (detokenizing) a space between special tokens and their neighbours
    # False: outputs carry token ids only (text "", logprobs' decoded_token None), no per-token decoding
    detokenize: bool = True
    # the output's constraint (JSON schema, regex, choice, grammar); a dict is read as its fields
    structured_outputs: StructuredOutputsParams | None = None
    # bad_words as token id sequences, set by the engine with its tokenizer (LLMEngine.check_params)
    bad_words_token_ids: list[list[int]] | None = field(default=None, repr=False)
    # whether a rule other than bad words changes the logits (set once: the step loop asks for every request)
    _logits_rules: bool = field(default=False, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.structured_outputs, dict):
            self.structured_outputs = StructuredOutputsParams.from_dict(self.structured_outputs)
        elif not isinstance(self.structured_outputs, (StructuredOutputsParams, type(None))):
            raise SamplingParamsError("structured_outputs", self.structured_outputs, ALLOWED["structured_outputs"])
        # vLLM's defaults are None; stored as [] so that downstream code sees lists only
        if self.stop is None:
            self.stop = []
        if self.stop_token_ids is None:
            self.stop_token_ids = []
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        for name in ("stop", "stop_token_ids"):
            value = getattr(self, name)
            if not isinstance(value, (list, tuple)):
                raise SamplingParamsError(name, value, ALLOWED[name])
            setattr(self, name, list(value))
        if self.top_k == -1:
            self.top_k = 0
        checks = [
            (_is_int(self.n) and self.n >= 1, "n", self.n, ALLOWED["n"]),
            (
                _is_real(self.temperature) and self.temperature >= 0.0,
                "temperature",
                self.temperature,
                ALLOWED["temperature"],
            ),
            (_is_real(self.top_p) and 0.0 < self.top_p <= 1.0, "top_p", self.top_p, ALLOWED["top_p"]),
            (_is_int(self.top_k) and self.top_k >= 0, "top_k", self.top_k, ALLOWED["top_k"]),
            (_is_real(self.min_p) and 0.0 <= self.min_p <= 1.0, "min_p", self.min_p, ALLOWED["min_p"]),
            (
                self.seed is None or (_is_int(self.seed) and SEED_MIN <= self.seed <= SEED_MAX),
                "seed",
                self.seed,
                ALLOWED["seed"],
            ),
            (
                self.max_tokens is None or (_is_int(self.max_tokens) and self.max_tokens >= 1),
                "max_tokens",
                self.max_tokens,
                ALLOWED["max_tokens"],
            ),
            (
                self.logprobs is None or (_is_int(self.logprobs) and 0 <= self.logprobs),
                "logprobs",
                self.logprobs,
                ALLOWED["logprobs"],
            ),
            (
                self.detokenize or not self.stop,
                "stop",
                self.stop,
                STOP_NEEDS_TEXT,
            ),
            (
                self.prompt_logprobs is None or (_is_int(self.prompt_logprobs) and 0 <= self.prompt_logprobs),
                "prompt_logprobs",
                self.prompt_logprobs,
                ALLOWED["prompt_logprobs"],
            ),
            (
                _is_real(self.presence_penalty) and -2.0 <= self.presence_penalty <= 2.0,
                "presence_penalty",
                self.presence_penalty,
                ALLOWED["presence_penalty"],
            ),
            (
                _is_real(self.frequency_penalty) and -2.0 <= self.frequency_penalty <= 2.0,
                "frequency_penalty",
                self.frequency_penalty,
                ALLOWED["frequency_penalty"],
            ),
            (
                _is_real(self.repetition_penalty) and self.repetition_penalty > 0.0,
                "repetition_penalty",
                self.repetition_penalty,
                ALLOWED["repetition_penalty"],
            ),
            (
                _is_int(self.min_tokens)
                and self.min_tokens >= 0
                # a max_tokens of the wrong type is refused above, by its own name
                and (not _is_int(self.max_tokens) or self.min_tokens <= self.max_tokens),
                "min_tokens",
                self.min_tokens,
                ALLOWED["min_tokens"],
            ),
            (
                self.truncate_prompt_tokens is None
                or (
                    _is_int(self.truncate_prompt_tokens)
                    and (self.truncate_prompt_tokens >= 1 or self.truncate_prompt_tokens == -1)
                ),
                "truncate_prompt_tokens",
                self.truncate_prompt_tokens,
                ALLOWED["truncate_prompt_tokens"],
            ),
            (
                self.logit_bias is None or isinstance(self.logit_bias, dict),
                "logit_bias",
                self.logit_bias,
                ALLOWED["logit_bias"],
            ),
            (
                self.bad_words is None or isinstance(self.bad_words, (list, tuple)),
                "bad_words",
                self.bad_words,
                ALLOWED["bad_words"],
            ),
            (
                self.allowed_token_ids is None
                or (isinstance(self.allowed_token_ids, (list, tuple)) and len(self.allowed_token_ids) > 0),
                "allowed_token_ids",
                self.allowed_token_ids,
                ALLOWED["allowed_token_ids"],
            ),
        ]
        for ok, name, value, allowed in checks:
            if not ok:
                raise SamplingParamsError(name, value, allowed)
        for name in _BOOL_FIELDS:  # a truthy string ("false") would otherwise switch the option on
            if not isinstance(getattr(self, name), bool):
                raise SamplingParamsError(name, getattr(self, name), TRUE_OR_FALSE)
        # list parameters: the first bad item, by its index
        for name, ok, allowed in (
            ("stop", lambda s: isinstance(s, str) and s != "", ITEMS["stop"]),
            ("stop_token_ids", lambda t: _is_int(t) and t >= 0, ITEMS["stop_token_ids"]),
        ):
            items = getattr(self, name)
            bad = next((i for i, item in enumerate(items) if not ok(item)), None)
            if bad is not None:
                raise SamplingParamsError(name, items[bad], allowed, index=bad)
        for name, ok, allowed in (
            ("bad_words", lambda s: isinstance(s, str), ITEMS["bad_words"]),
            ("allowed_token_ids", lambda t: _is_int(t) and t >= 0, ITEMS["allowed_token_ids"]),
        ):
            items = getattr(self, name) or []
            bad = next((i for i, item in enumerate(items) if not ok(item)), None)
            if bad is not None:
                raise SamplingParamsError(name, items[bad], allowed, index=bad)
        if self.logit_bias is not None:
            for token, bias in self.logit_bias.items():
                if not (_is_int(token) and token >= 0):
                    raise SamplingParamsError("logit_bias", token, LOGIT_BIAS_KEYS)
                if not _is_real(bias):
                    raise SamplingParamsError("logit_bias", bias, LOGIT_BIAS_VALUES)
            self.logit_bias = {int(t): float(b) for t, b in self.logit_bias.items()}
        if self.bad_words is not None:
            self.bad_words = list(self.bad_words)
        if self.allowed_token_ids is not None:
            self.allowed_token_ids = list(self.allowed_token_ids)
        self._logits_rules = (
            self.has_penalties or bool(self.logit_bias) or self.min_tokens > 0 or self.allowed_token_ids is not None
        )

    def snapshot(self) -> SamplingParams:
        """A copy checked and derived anew from the current field values, for the engine to keep: a field changed
        after construction (``sp.presence_penalty = 1.5``, as vLLM code does) takes effect or is refused here, as at
        construction (SamplingParamsError), and later changes to this object reach no queued request. The engine
        tokenizes bad words into the copy (``bad_words_token_ids``), never into this object."""
        return dataclasses.replace(self)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        """Whether the token counts are needed (presence, frequency or repetition penalty set)."""
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

    @property
    def changes_logits(self) -> bool:
        """Whether the logits are processed before sampling (penalties, bias, min_tokens, bad words, allowed ids)."""
        return self._logits_rules or bool(self.bad_words_token_ids)

    @property
    def bad_words_history(self) -> int:
        """How many of the last output tokens the bad words' prefixes look at (the longest word's length - 1)."""
        return max((len(w) for w in self.bad_words_token_ids or ()), default=1) - 1
