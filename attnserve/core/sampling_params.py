"""SamplingParams: how one request's tokens are chosen and when it stops (vLLM's field names)."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

from attnserve.refusals import Refusal, Refused, range_words
from attnserve.config.model import SEED_MAX, SEED_MIN, SEED_WORDS
from attnserve.core.structured_outputs import StructuredOutputsParams

MAX_LOGPROBS = 20  # the most top logprobs a request may ask for (vLLM's default max_logprobs)


def _is_int(x) -> bool:  # int or numpy integer, not bool
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_real(x) -> bool:  # finite int or float (numpy's too), not bool
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


# each numeric parameter's allowed values in words (config.fields.range_words, as every range the CLI and the
# config records name): this module's errors, and generate's flags
ALLOWED = {
    "n": range_words("integer", (">=", 1), None),
    "temperature": range_words("finite number", (">=", 0), None),
    "top_p": range_words("number", (">", 0), ("<=", 1)),
    "top_k": "0 or -1 (all), or " + range_words("integer", (">=", 1), None),
    "min_p": range_words("number", (">=", 0), ("<=", 1)),
    "seed": SEED_WORDS + ", or None",  # the engine's seed, and the server's, take the same range
    "max_tokens": range_words("integer", (">=", 1), None),
    "logprobs": range_words("integer", (">=", 0), ("<=", MAX_LOGPROBS)),
}


def completion_seed(seed: int, i: int) -> int:
    """The seed of completion ``i`` of a request seeded ``seed``: ``seed + i``, wrapped into the seed range [-2^63,
    2^63 - 1] as 64-bit integers wrap (2^63 - 1 + 1 is -2^63, the seed torch reads for 2^63), so that every seed in
    the range works with every n (vLLM seeds completion i with seed + i too)."""
    return (seed + i - SEED_MIN) % 2**64 + SEED_MIN


class SamplingParamsError(Refused):
    """A sampling parameter outside its allowed values: its ``name`` (``"stop"``), the ``value`` refused (for a
    list parameter, the first bad item, at ``index``) and the ``allowed`` values in words. The message is ``stop
    '' not allowed (allowed: non-empty strings)``; the record's path is the parameter (the item's index is
    ``index``, which the server's ``param`` adds: ``stop.1``)."""

    __reduce__ = Refused.reduce_from_record

    def __init__(self, name: str, value: object, allowed: str, index: int | None = None) -> None:
        self.name, self.index = name, index
        super().__init__(Refusal((name,), value, allowed))


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
    skip_special_tokens: bool = True
    # False: outputs carry token ids only (text "", logprobs' decoded_token None), no per-token decoding
    detokenize: bool = True
    # the output's constraint (JSON schema, regex, choice, grammar); a dict is read as its fields
    structured_outputs: StructuredOutputsParams | None = None

    def __post_init__(self) -> None:
        if isinstance(self.structured_outputs, dict):
            self.structured_outputs = StructuredOutputsParams.from_dict(self.structured_outputs)
        elif not isinstance(self.structured_outputs, (StructuredOutputsParams, type(None))):
            raise SamplingParamsError("structured_outputs", self.structured_outputs,
                                      "a StructuredOutputsParams, a dict of its fields, or None")
        # vLLM's defaults are None; stored as [] so that downstream code sees lists only
        if self.stop is None:
            self.stop = []
        if self.stop_token_ids is None:
            self.stop_token_ids = []
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        for name, allowed in (("stop", "a string, a list of strings, or None"),
                              ("stop_token_ids", "a list of token ids, or None")):
            value = getattr(self, name)
            if not isinstance(value, (list, tuple)):
                raise SamplingParamsError(name, value, allowed)
            setattr(self, name, list(value))
        if self.top_k == -1:
            self.top_k = 0
        checks = [
            (_is_int(self.n) and self.n >= 1, "n", self.n, ALLOWED["n"]),
            (_is_real(self.temperature) and self.temperature >= 0.0, "temperature", self.temperature, ALLOWED["temperature"]),
            (_is_real(self.top_p) and 0.0 < self.top_p <= 1.0, "top_p", self.top_p, ALLOWED["top_p"]),
            (_is_int(self.top_k) and self.top_k >= 0, "top_k", self.top_k, ALLOWED["top_k"]),
            (_is_real(self.min_p) and 0.0 <= self.min_p <= 1.0, "min_p", self.min_p, ALLOWED["min_p"]),
            (self.seed is None or (_is_int(self.seed) and SEED_MIN <= self.seed <= SEED_MAX), "seed", self.seed,
             ALLOWED["seed"]),
            (self.max_tokens is None or (_is_int(self.max_tokens) and self.max_tokens >= 1), "max_tokens",
             self.max_tokens, ALLOWED["max_tokens"]),
            (self.logprobs is None or (_is_int(self.logprobs) and 0 <= self.logprobs <= MAX_LOGPROBS), "logprobs",
             self.logprobs, ALLOWED["logprobs"]),
            (self.detokenize or not self.stop, "stop", self.stop,
             "none when detokenize is False: stop strings match text"),
        ]
        for ok, name, value, allowed in checks:
            if not ok:
                raise SamplingParamsError(name, value, allowed)
        # list parameters: the first bad item, by its index
        for name, ok, allowed in (("stop", lambda s: isinstance(s, str) and s != "", "non-empty strings"),
                                  ("stop_token_ids", lambda t: _is_int(t) and t >= 0, "token ids (integers >= 0)")):
            items = getattr(self, name)
            bad = next((i for i, item in enumerate(items) if not ok(item)), None)
            if bad is not None:
                raise SamplingParamsError(name, items[bad], allowed, index=bad)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
