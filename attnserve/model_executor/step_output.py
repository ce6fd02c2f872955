"""What a ModelRunner step hands back: ``ModelRunnerOutput`` (sampled tokens on the host), ``PendingStep`` (on their
way there), and ``QueuedForward`` (a step whose forward pass is queued; its ``sample`` queues the sampling stage:
the greedy head or the logits, the logits processors, the grammar bitmask, the sampler).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from attnserve.model_executor.sampler import DeviceSample
from attnserve.model_executor.sampling_batch import LastSample
from attnserve.structured_output.bitmask import apply_grammar_bitmask

if TYPE_CHECKING:
    from attnserve.model_executor.model_runner import ModelRunner


@dataclass
class ModelRunnerOutput:
    """Sampled token and logprobs of each request that sampled this step."""

    sampled: dict[str, tuple[int, tuple | None]]
    # requests with prompt_logprobs that computed prompt positions this step: (index of the first entry, entries);
    # entry i is prompt token i + 1's (logprob, rank, [(token_id, logprob)] top-k)
    prompt_logprobs: dict[str, tuple[int, list]] = field(default_factory=dict)

    def result(self) -> "ModelRunnerOutput":  # already on the host (a step that ran to completion)
        return self


@dataclass
class PendingStep:
    """A queued step's sampled tokens, on their way to the host; ``result()`` waits for them."""

    request_ids: list[str]  # the requests that sample, in the sample's row order
    sample: DeviceSample | None  # None: nothing sampled (empty step, or a rank that does not sample)
    prompt_logprobs: dict[str, tuple[int, list]] = field(default_factory=dict)  # already on the host

    def result(self) -> ModelRunnerOutput:
        if self.sample is None:
            return ModelRunnerOutput(sampled={}, prompt_logprobs=self.prompt_logprobs)
        out = self.sample.result()
        return ModelRunnerOutput(
            sampled={rid: (out.token_ids[j], out.logprobs[j]) for j, rid in enumerate(self.request_ids)},
            prompt_logprobs=self.prompt_logprobs,
        )


@dataclass
class QueuedForward:
    """A step whose forward pass is queued and whose sampling is not: ``sample(grammar_bitmask)`` queues it
    (``ModelRunner.queue_forward``). Sample each before the next step's forward pass is queued."""

    runner: ModelRunner
    requests: list  # the ScheduledRequests that sample, in row order
    hidden: torch.Tensor | None  # (B, hidden) at each request's last token (None: empty step)
    sample_rows: torch.Tensor | None  # rows of ``hidden`` that sample, when not all do
    scheduled: list = field(default_factory=list)  # every ScheduledRequest of the step (penalty slots)
    prompt_logprobs: dict = field(default_factory=dict)  # computed already (on the host)
    logits: torch.Tensor | None = None  # (B, vocab) queued with the forward pass (a step of constrained requests)

    @torch.inference_mode()
    def sample(self, grammar_bitmask=None) -> PendingStep:
        """Queue the sampling; ``grammar_bitmask``: the constrained rows' ``GrammarBitmask`` (host), or None."""
        runner, bitmask = self.runner, grammar_bitmask
        reqs, hidden, sample_rows, prompt_logprobs = self.requests, self.hidden, self.sample_rows, self.prompt_logprobs
        if not reqs:
            if runner.tp.is_driver:  # a step of partial prefills: their penalty slots are filled before they sample
                runner.logits_processors.admit(self.scheduled, runner.dims.vocab_size)
            return PendingStep([], None, prompt_logprobs)
        batch = runner.sampling.sampling_batch(reqs)
        # the fused greedy head (no logits: a grammar bitmask is applied inside it), where it applies
        fused = sample_rows is None and self.logits is None and runner.greedy_head.applies(batch.params)
        # structured outputs: the constrained rows' bitmask to the device (from its pinned buffer, non-blocking)
        grammar = None if bitmask is None else bitmask.to(runner.staging, with_index=fused)
        tokens = runner.greedy_head.run(hidden, grammar) if fused else None
        logits = (
            self.logits
            if self.logits is not None
            else (runner.model.compute_logits(hidden) if tokens is None else None)
        )
        if runner.tp.is_driver and (batch.penalties or len(self.scheduled) != len(reqs)):
            # every step: a request's prompt tokens come only with its first (partial) prefill
            runner.logits_processors.admit(
                self.scheduled, runner.dims.vocab_size if logits is None else logits.shape[1]
            )
        if not runner.tp.is_driver:  # no sampler here: rank 0's tokens come by broadcast when a placeholder needs them
            runner.sampling.last_sample = LastSample(None, batch.rows)
            return PendingStep([], None)
        if tokens is not None:
            sample = runner.sampler.queue(tokens)
        else:
            # every row samples in most steps: no copy of the (B, vocab) logits then
            raw = logits if sample_rows is None else logits[sample_rows]
            if batch.changes_logits:  # the one logits-processing stage
                last = runner.sampling.last_sample
                logits = runner.logits_processors(raw, reqs, last.token_ids, last.rows)
            else:
                logits = raw
            logits = apply_grammar_bitmask(logits, grammar)  # structured outputs: disallowed tokens -inf
            sample = runner.sampler.sample(
                logits, batch.params, batch.generators, raw_logits=raw, rows=batch.sampler_rows
            )
            if batch.penalties:
                runner.logits_processors.record(reqs, sample.token_ids)
        runner.sampling.last_sample = LastSample(sample.token_ids, batch.rows)
        return PendingStep(list(batch.request_ids), sample, prompt_logprobs)
