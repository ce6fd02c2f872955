"""What a step's sampling stage reads besides the logits: ``SamplingBatch`` (the sampling requests' parameters,
rows and generators, made once per distinct batch: a decode step mostly samples the same requests as the step
before) and ``LastSample`` (the tokens a step sampled, on the device, which the next step's placeholders and
multi-token bad words read).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnserve.core.sampling_params import SamplingParams
from attnserve.core.step import ScheduledRequest
from attnserve.model_executor.sampler import SamplerRows


@dataclass(frozen=True)
class LastSample:
    """The tokens the last step sampled and each sampling request's row in them."""

    # (R,) int64 on the device; None on a tensor-parallel rank that does not sample, until a step broadcasts them
    token_ids: torch.Tensor | None
    rows: dict[str, int]  # request id -> row of token_ids (shared with the SamplingBatch: read only)


NO_SAMPLE = LastSample(None, {})


@dataclass(frozen=True)
class SamplingBatch:
    """A batch of sampling requests as the sampling stage sees it, from their ids and parameters alone."""

    request_ids: tuple[str, ...]  # the sampling requests, in row order (the cache key, with the params below)
    params: list[SamplingParams]  # per row
    rows: dict[str, int]  # request id -> row
    generators: list[torch.Generator | None]  # per row: the request's own (seeded) or the runner's shared one
    changes_logits: bool  # some row's logits pass through the logits processors
    penalties: bool  # some row has penalties: its sampled tokens are counted on the device
    sampler_rows: SamplerRows

    @staticmethod
    def of(reqs: list[ScheduledRequest], generator) -> SamplingBatch:
        """``generator(request_id, seed)``: the row's generator (the runner's)."""
        params = [r.sampling_params for r in reqs]
        return SamplingBatch(
            request_ids=tuple(r.request_id for r in reqs),
            params=params,
            rows={r.request_id: j for j, r in enumerate(reqs)},
            generators=[generator(r.request_id, p.seed) for r, p in zip(reqs, params)],
            changes_logits=any(p.changes_logits for p in params),
            penalties=any(p.has_penalties for p in params),
            sampler_rows=SamplerRows.of(params),
        )

    def matches(self, reqs: list[ScheduledRequest]) -> bool:
        """Whether ``reqs`` are this batch's requests, in its order, with its parameter objects."""
        if len(reqs) != len(self.params):
            return False
        ids, params = self.request_ids, self.params
        for j, r in enumerate(reqs):
            if r.request_id != ids[j] or r.sampling_params is not params[j]:
                return False
        return True


class SamplingState:
    """The runner's per-request sampling state: each seeded request's random generator (kept until it finishes),
    the shared generator of unseeded ones, the last step's :class:`SamplingBatch` (reused while its requests stay)
    and :class:`LastSample` (the tokens the next step's placeholders read)."""

    def __init__(self, device: torch.device, seed: int) -> None:
        self.device = device
        self.default_generator = torch.Generator(device=device).manual_seed(seed)
        self.generators: dict[str, torch.Generator] = {}
        # the last step's sampled tokens on the device and each sampling request's row in them; under TP only
        # rank 0 samples: the others hold no tokens until a placeholder step broadcasts them
        self.last_sample: LastSample = NO_SAMPLE
        self._batch: SamplingBatch | None = None  # the last step's (reused while its requests stay)

    def generator(self, request_id: str, seed: int | None) -> torch.Generator:
        """The random generator of a request's rows: its own, seeded once with ``seed`` (kept until it finishes),
        or the shared one (``seed`` None)."""
        if seed is None:
            return self.default_generator
        if request_id not in self.generators:
            self.generators[request_id] = torch.Generator(device=self.device).manual_seed(seed)
        return self.generators[request_id]

    def sampling_batch(self, reqs: list[ScheduledRequest]) -> SamplingBatch:
        """The ``SamplingBatch`` of a step's sampling requests ``reqs`` (ScheduledRequests, row order): the last
        step's when it has the same requests in the same order, else a new one."""
        last = self._batch
        if last is not None and last.matches(reqs):
            return last
        self._batch = batch = SamplingBatch.of(reqs, self.generator)
        return batch

    def forget(self, finished_ids: list[str], preempted_ids: list[str]) -> None:
        """Drop the generators of finished requests; a finished or preempted request id may come back with other
        params, so the last step's batch is not reused."""
        for rid in finished_ids:
            self.generators.pop(rid, None)
        if finished_ids or preempted_ids:
            self._batch = None
