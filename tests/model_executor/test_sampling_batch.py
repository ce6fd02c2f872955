"""SamplingBatch: the sampling stage's per-batch state, reused only for the same requests with the same params."""

from __future__ import annotations

from attnserve.core.sampling_params import SamplingParams
from attnserve.core.step import ScheduledRequest
from attnserve.model_executor.sampling_batch import SamplingBatch


def _req(rid: str, params: SamplingParams) -> ScheduledRequest:
    return ScheduledRequest(rid, [1], 0, [0], params, True)


def test_rows_generators_and_flags_and_when_a_batch_matches():
    greedy = SamplingParams(temperature=0.0)
    seeded = SamplingParams(temperature=0.8, seed=3, logprobs=2)
    penalized = SamplingParams(temperature=0.0, presence_penalty=0.5)
    made = []

    def generator(rid, seed):
        made.append((rid, seed))
        return f"gen-{rid}" if seed is not None else "shared"

    reqs = [_req("a", greedy), _req("b", seeded), _req("c", penalized)]
    batch = SamplingBatch.of(reqs, generator)
    assert batch.rows == {"a": 0, "b": 1, "c": 2} and batch.generators == ["shared", "gen-b", "shared"]
    assert made == [("a", None), ("b", 3), ("c", None)]
    assert batch.changes_logits and batch.penalties
    rows = batch.sampler_rows
    assert (rows.random, rows.want, rows.ks) == ([1], [1], [2])
    assert batch.matches([_req("a", greedy), _req("b", seeded), _req("c", penalized)])  # new records, same requests
    assert not batch.matches([_req("b", seeded), _req("a", greedy), _req("c", penalized)])  # another order
    assert not batch.matches(reqs[:2])
    assert not batch.matches([_req("a", SamplingParams(temperature=0.0)), reqs[1], reqs[2]])  # another params object
    plain = SamplingBatch.of([_req("a", greedy)], generator)
    assert not plain.changes_logits and not plain.penalties and plain.sampler_rows.random == []


def test_sampling_state_keeps_a_seeded_generator_until_its_request_finishes():
    import torch

    from attnserve.model_executor.sampling_batch import NO_SAMPLE, SamplingState

    state = SamplingState(torch.device("cpu"), seed=0)
    assert state.last_sample is NO_SAMPLE
    assert state.generator("a", None) is state.default_generator
    own = state.generator("b", 7)
    assert state.generator("b", 7) is own and list(state.generators) == ["b"]
    expected = torch.Generator().manual_seed(7)
    assert torch.equal(torch.rand(3, generator=own), torch.rand(3, generator=expected))
    seeded = SamplingParams(temperature=0.8, seed=7)
    reqs = [_req("b", seeded)]
    batch = state.sampling_batch(reqs)
    assert state.sampling_batch([_req("b", seeded)]) is batch  # the same requests: the last step's batch
    state.forget([], ["x"])  # a preemption: the batch is made again, the generators stay
    assert state.sampling_batch(reqs) is not batch and list(state.generators) == ["b"]
    state.forget(["b"], [])
    assert state.generators == {} and state.generator("b", 7) is not own
