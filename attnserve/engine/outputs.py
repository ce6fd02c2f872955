"""What the engine returns for a request: completions with text, tokens, logprobs, finish reason, timing."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Logprob:
    """One token's log probability under the model (natural log) and its rank (1 = most likely)."""

    logprob: float
    rank: int
    decoded_token: str | None  # None when the request's detokenize is False


@dataclass
class RequestMetrics:
    """Times in seconds (``time.monotonic``). TTFT = first_token_time - arrival_time."""

    arrival_time: float
    first_token_time: float | None = None
    finished_time: float | None = None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def e2e(self) -> float | None:
        return None if self.finished_time is None else self.finished_time - self.arrival_time


@dataclass
class CompletionOutput:
    """One of the ``n`` completions of a request.

    While the request runs, ``token_ids`` and ``logprobs`` are the engine's own lists (vLLM's cumulative
    outputs do the same): they keep growing on later steps, so a step's output costs no O(length) copy.
    Read them before the next step, or keep ``RequestOutput.snapshot()``. A finished output's lists are final.
    """

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop", "length", "abort", None while running
    stop_reason: str | int | None = None
    # per generated token: {token_id: Logprob} with the sampled token and the top-k, when asked for
    logprobs: list[dict[int, Logprob]] | None = None
    text_delta: str = ""  # text added by the last step (streaming)
    num_new_tokens: int = 0  # tokens added by the last step (streaming)
    # sum of the sampled tokens' logprobs (those in ``logprobs``) when logprobs were asked for, else None
    cumulative_logprob: float | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """The state of one request (all its completions) after a step, or at the end."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics
    num_preemptions: int = 0
    extra: dict = field(default_factory=dict)
    # prompt tokens whose KV came from the prefix cache (the first completion's, at its first admission)
    num_cached_tokens: int = 0
    # with SamplingParams.prompt_logprobs: None for the first prompt token, then {token_id: Logprob} per prompt
    # token (the token itself and the top-k); None without prompt_logprobs
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None

    def snapshot(self) -> RequestOutput:
        """A copy whose completions' ``token_ids`` and ``logprobs`` stay as they are now (for a reader that
        may look after the engine's next step, e.g. on another thread)."""
        outputs = [
            CompletionOutput(
                c.index,
                c.text,
                list(c.token_ids),
                c.finish_reason,
                c.stop_reason,
                None if c.logprobs is None else list(c.logprobs),
                c.text_delta,
                c.num_new_tokens,
                c.cumulative_logprob,
            )
            for c in self.outputs
        ]
        return RequestOutput(
            self.request_id,
            self.prompt,
            self.prompt_token_ids,
            outputs,
            self.finished,
            self.metrics,
            self.num_preemptions,
            self.extra,
            self.num_cached_tokens,
            self.prompt_logprobs,
        )

    def to_dict(self) -> dict:
        """JSON-ready summary (for ``--output-json``)."""
        return {
            "request_id": self.request_id,
            "prompt": self.prompt,
            "prompt_token_ids": self.prompt_token_ids,
            "outputs": [
                {
                    "index": o.index,
                    "text": o.text,
                    "token_ids": o.token_ids,
                    "finish_reason": o.finish_reason,
                    "cumulative_logprob": o.cumulative_logprob,
                    "logprobs": None
                    if o.logprobs is None
                    else [
                        {
                            str(t): {"logprob": lp.logprob, "rank": lp.rank, "token": lp.decoded_token}
                            for t, lp in d.items()
                        }
                        for d in o.logprobs
                    ],
                }
                for o in self.outputs
            ],
            "num_cached_tokens": self.num_cached_tokens,
            "prompt_logprobs": None
            if self.prompt_logprobs is None
            else [
                None
                if d is None
                else {
                    str(t): {"logprob": lp.logprob, "rank": lp.rank, "token": lp.decoded_token} for t, lp in d.items()
                }
                for d in self.prompt_logprobs
            ],
            "ttft_s": self.metrics.ttft,
            "e2e_s": self.metrics.e2e,
        }
