"""One step's plan, as the scheduler makes it and the executors and the model runner run it. No torch."""

from __future__ import annotations

from dataclasses import dataclass, field

from attnserve.core.sampling_params import SamplingParams

# a token id the host does not know yet (sampled by the step in flight); the model runner fills it in on the device
PLACEHOLDER_TOKEN = -1


@dataclass
class ScheduledRequest:
    """One request's share of a step."""

    request_id: str
    token_ids: list[int]  # the tokens to compute this step (a decode: its one new token)
    start_position: int  # position of token_ids[0] in the sequence
    # physical blocks covering positions 0 .. start_position + len(token_ids) - 1: the block manager's own
    # list, not a copy (valid for this step; it grows in place on later steps)
    block_table: list[int]
    sampling_params: SamplingParams
    samples: bool  # True when this step reaches the end of the sequence, so its sampled token is kept
    # what the logits processors read (model_executor/logits_processors.py), set only where the params need it:
    num_output_tokens: int = 0  # output tokens before this step's sample (known and pending)
    eos_token_id: int | None = None  # masked with the stop ids while num_output_tokens < min_tokens
    # the request's whole known history, at (re)admission of a request with penalties (its token counts start here)
    # and on prefill steps of a request with prompt_logprobs (the targets); copies
    prompt_token_ids: list[int] | None = None
    output_token_ids: list[int] | None = None
    # the last known output tokens (up to the longest bad word's length - 1), for multi-token bad words; the
    # pending one, when num_output_tokens counts one more, is the last step's sample on the device
    recent_output_ids: list[int] | None = None
    output_pending: bool = False  # the last output token is in flight (not in recent_output_ids)


@dataclass
class SchedulerOutput:
    """A step's plan: scheduled requests ordered decodes (one token) first, then the longer ones."""

    requests: list[ScheduledRequest]
    preempted_ids: list[str] = field(default_factory=list)
    finished_ids: list[str] = field(default_factory=list)  # finished since the last step (runner frees state)
    # structured outputs: the constrained sampling rows' token bitmask (structured_output.bitmask.GrammarBitmask,
    # from StructuredOutputManager.bitmask), None when no sampling row is constrained
    grammar_bitmask: object | None = None

    @property
    def num_tokens(self) -> int:
        return sum(len(r.token_ids) for r in self.requests)

    @property
    def is_empty(self) -> bool:
        return not self.requests
