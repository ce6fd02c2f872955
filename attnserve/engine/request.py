"""Request: one sequence's tokens, progress and state inside the engine. No torch."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from attnserve.core.sampling_params import SamplingParams
from attnserve.core.step import PLACEHOLDER_TOKEN  # noqa: F401 (the token a pending step feeds; its old home)


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(str, enum.Enum):
    """Why a request stopped (OpenAI's finish_reason values)."""

    STOP = "stop"  # EOS, a stop token or a stop string
    LENGTH = "length"  # max_tokens or max_model_len (or the whole KV cache, when smaller) reached
    ABORT = "abort"


@dataclass
class Request:
    """One sequence. ``num_computed_tokens`` catches up to ``num_tokens`` under the scheduler's budget
    (advanced when a step is scheduled); the step that reaches the end samples a token, appended when the
    step's result is read. Preemption resets it to 0 (recompute).

    Under async scheduling the next step is scheduled before the last one's token is known: that token is
    *pending* (``num_pending``, 0 or 1 when a step is scheduled) and the next step feeds it to the model
    from the device (:data:`PLACEHOLDER_TOKEN` in the scheduled token ids)."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_id: int | None
    max_model_len: int  # the most tokens it may reach (the engine's max_request_len)
    arrival_time: float = field(default_factory=time.monotonic)
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_pending: int = 0  # tokens sampled by steps in flight, not yet appended
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None  # the stop string or token id that ended it
    first_token_time: float | None = None
    finished_time: float | None = None
    num_preemptions: int = 0
    # prompt tokens found in the prefix cache at the first admission (None until admitted)
    num_cached_tokens: int | None = None
    # hashes of the full blocks of known tokens (prefix caching; block_hash.py), extended as tokens come
    block_hashes: list[bytes] = field(default_factory=list)
    # per output token: (logprob, rank, top [(token_id, logprob)]), when logprobs were asked for
    output_logprobs: list = field(default_factory=list)
    # per prompt token after the first: (logprob, rank, top [(token_id, logprob)]), when prompt_logprobs were asked for
    prompt_logprobs: list = field(default_factory=list)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_slice(self, start: int, end: int) -> list[int]:
        """``all_token_ids[start:end]`` without building the whole list (a decode step needs one token)."""
        prompt_len = len(self.prompt_token_ids)
        if start >= prompt_len:
            return self.output_token_ids[start - prompt_len : end - prompt_len]
        if end <= prompt_len:
            return self.prompt_token_ids[start:end]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - prompt_len]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_scheduled_tokens(self) -> int:
        """Tokens the scheduler may compute: the known ones plus the pending ones."""
        return self.num_tokens + self.num_pending

    def length_reached_with_pending(self) -> bool:
        """True when the pending tokens already reach max_tokens or max_model_len: no further step is needed."""
        p = self.sampling_params
        n_out = len(self.output_token_ids) + self.num_pending
        return (p.max_tokens is not None and n_out >= p.max_tokens) or self.num_scheduled_tokens >= self.max_model_len

    @property
    def is_finished(self) -> bool:
        return self.status == RequestStatus.FINISHED

    def append_token(self, token_id: int, logprobs=None) -> None:
        """Add a sampled token and apply the token-level stop rules (EOS, stop ids, max_tokens, length)."""
        if self.first_token_time is None:
            self.first_token_time = time.monotonic()
        self.output_token_ids.append(token_id)
        if logprobs is not None:
            self.output_logprobs.append(logprobs)
        p = self.sampling_params
        if len(self.output_token_ids) < p.min_tokens:  # vLLM's check_stop: no EOS or stop id before min_tokens
            if (p.max_tokens is not None and len(self.output_token_ids) >= p.max_tokens) or (
                self.num_tokens >= self.max_model_len
            ):
                self.finish(FinishReason.LENGTH)
        elif not p.ignore_eos and token_id == self.eos_token_id:
            self.finish(FinishReason.STOP)
        elif token_id in p.stop_token_ids:
            self.finish(FinishReason.STOP, stop_reason=token_id)
        elif (p.max_tokens is not None and len(self.output_token_ids) >= p.max_tokens) or (
            self.num_tokens >= self.max_model_len
        ):
            self.finish(FinishReason.LENGTH)

    def finish(self, reason: FinishReason, stop_reason: str | int | None = None) -> None:
        self.status = RequestStatus.FINISHED
        self.finish_reason = reason
        self.stop_reason = stop_reason
        self.finished_time = time.monotonic()
