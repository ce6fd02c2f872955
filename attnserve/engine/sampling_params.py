"""SamplingParams: how one request's tokens are chosen and when it stops (vLLM's field names)."""

from __future__ import annotations

from dataclasses import dataclass, field


class SamplingParamsError(ValueError):
    """A sampling parameter outside its allowed range; the message names the value and the range."""


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
    seed: int | None = None  # per-request random seed
    max_tokens: int | None = 16  # None = up to max_model_len
    stop: list[str] = field(default_factory=list)  # stop strings, not included in the output text
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None  # number of top logprobs per generated token (the sampled one is added)
    skip_special_tokens: bool = True
    # False: outputs carry token ids only (text "", logprobs' decoded_token None), no per-token decoding
    detokenize: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids)
        if self.top_k == -1:
            self.top_k = 0
        checks = [
            (self.n >= 1, "n", self.n, "integer >= 1"),
            (self.temperature >= 0.0, "temperature", self.temperature, ">= 0"),
            (0.0 < self.top_p <= 1.0, "top_p", self.top_p, "(0, 1]"),
            (self.top_k >= 0, "top_k", self.top_k, "0 or -1 (all), or integer >= 1"),
            (0.0 <= self.min_p <= 1.0, "min_p", self.min_p, "[0, 1]"),
            (self.max_tokens is None or self.max_tokens >= 1, "max_tokens", self.max_tokens, "integer >= 1"),
            (self.logprobs is None or self.logprobs >= 0, "logprobs", self.logprobs, "integer >= 0"),
            (all(s for s in self.stop), "stop", self.stop, "non-empty strings"),
            (self.detokenize or not self.stop, "stop", self.stop,
             "none when detokenize is False: stop strings match text"),
        ]
        for ok, name, value, allowed in checks:
            if not ok:
                raise SamplingParamsError(f"{name} {value!r} not allowed (allowed: {allowed})")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
