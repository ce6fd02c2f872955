"""The batched Sampler on plain logits: greedy, filters (per row), the sampled distribution, seeds, logprobs,
and how often it copies to the host. Each test runs on the CPU and, marked gpu, on CUDA."""

from __future__ import annotations

import pytest
import torch

from attnserve.engine.sampling_params import SamplingParams
from attnserve.model_executor.sampler import Sampler

V = 50


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def dev(request) -> torch.device:
    return torch.device(request.param)


def logits_rows(num_rows: int, vocab: int = V, seed: int = 0, device="cpu") -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(num_rows, vocab, generator=g) * 3.0).to(device)


def gen(seed: int, device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def sample(logits, params, seed: int = 0, generators=None):
    if generators is None:
        shared = gen(seed, logits.device)
        generators = [shared if p.seed is None else gen(p.seed, logits.device) for p in params]
    return Sampler()(logits, params, generators)


def reference_probs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """The filtered distribution of one row ``(V,)``, one filter at a time (the sampler's old per-row code)."""
    x = logits.cpu() / p.temperature
    if 0 < p.top_k < x.shape[-1]:
        x = x.masked_fill(x < torch.topk(x, p.top_k).values[-1], float("-inf"))
    if p.top_p < 1.0:
        sorted_x, order = torch.sort(x, descending=True)
        probs = sorted_x.softmax(-1)
        drop = (probs.cumsum(-1) - probs) >= p.top_p
        drop[0] = False
        x = x.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    if p.min_p > 0.0:
        probs = x.softmax(-1)
        x = x.masked_fill(probs < p.min_p * probs.max(), float("-inf"))
    return x.softmax(-1)


def test_greedy_is_argmax(dev):
    logits = logits_rows(64, device=dev)
    out = sample(logits, [SamplingParams(temperature=0.0)] * 64)
    assert out.token_ids == logits.argmax(-1).tolist()
    assert out.logprobs == [None] * 64


def test_filters_that_keep_one_token_are_greedy_row_by_row(dev):
    # one batch, a different filter per row: each keeps only the most likely token
    logits = logits_rows(5, device=dev)
    params = [
        SamplingParams(temperature=1.0, top_k=1),
        SamplingParams(temperature=2.0, top_p=1e-9),  # the first token always stays
        SamplingParams(temperature=0.7, min_p=1.0),
        SamplingParams(temperature=1.0, top_k=1, top_p=0.5, seed=3),
        SamplingParams(temperature=0.0),
    ]
    for seed in range(5):
        assert sample(logits, params, seed).token_ids == logits.argmax(-1).tolist()


def test_a_filtered_token_is_never_sampled(dev):
    logits = logits_rows(4, device=dev)
    params = [
        SamplingParams(temperature=3.0, top_k=5),
        SamplingParams(temperature=3.0, top_p=0.6),
        SamplingParams(temperature=3.0, min_p=0.2),
        SamplingParams(temperature=3.0, top_k=10, top_p=0.8, min_p=0.05),
    ]
    kept = [set(reference_probs(logits[i], p).nonzero().flatten().tolist()) for i, p in enumerate(params)]
    assert all(1 < len(k) < V for k in kept)  # each filter really removes tokens and leaves a choice
    seen = [set() for _ in params]
    for seed in range(300):
        for i, t in enumerate(sample(logits, params, seed).token_ids):
            seen[i].add(t)
    for i in range(len(params)):
        assert seen[i] <= kept[i]
        assert len(seen[i]) > 1


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.5, top_k=6),
        SamplingParams(temperature=2.0, top_p=0.7),
        SamplingParams(temperature=1.0, min_p=0.1),
        SamplingParams(temperature=1.3, top_k=7, top_p=0.9, min_p=0.05),
    ],
)
def test_sampled_frequencies_match_the_filtered_softmax(params, dev):
    # N draws in one batch (one noise draw, seed fixed: deterministic). Each frequency is a mean of N
    # Bernoulli(p) draws, standard deviation sqrt(p (1 - p) / N) <= 0.0035 at N = 20000; a bound of 5 of
    # those (plus 1e-3 for float rounding of p) is exceeded with probability < 1e-6 per token by chance, so
    # a failure means a wrong distribution, not bad luck. Filtered tokens must have frequency exactly 0.
    n = 20000
    row = logits_rows(1, vocab=12, seed=1, device=dev)[0]
    expected = reference_probs(row, params).to(dev)
    out = sample(row.expand(n, -1).contiguous(), [params] * n, seed=123)
    freq = torch.bincount(torch.tensor(out.token_ids, device=dev), minlength=12).double() / n
    bound = 5 * torch.sqrt(expected.double() * (1 - expected.double()) / n) + 1e-3
    assert torch.all((freq - expected.double()).abs() <= bound), (freq, expected)
    assert torch.all(freq[expected == 0] == 0)


def test_seeded_rows_do_not_depend_on_the_batch(dev):
    logits = logits_rows(6, device=dev)
    seeded = SamplingParams(temperature=1.0, top_p=0.95, seed=7)
    alone = [sample(logits[2:3], [seeded]).token_ids[0]]
    # the same seeded row, in a batch with unseeded, greedy and other-seed rows, at another index
    batch = [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.0),
        seeded,
        SamplingParams(temperature=0.8, seed=1),
        SamplingParams(temperature=1.0, top_k=3),
        seeded,
    ]
    gens = {}
    tokens = []
    # two steps in a row with the request's own generator: the second draw continues the first
    for step in range(2):
        g_shared = gen(99 + step, dev)
        generators = []
        for i, p in enumerate(batch):
            if p.seed is None:
                generators.append(g_shared)
            else:
                generators.append(gens.setdefault(i, gen(p.seed, dev)))
        tokens.append(
            Sampler()(
                torch.stack([logits[0], logits[1], logits[2], logits[3], logits[4], logits[2]]), batch, generators
            ).token_ids
        )
    solo_gen = gen(7, dev)
    solo = [Sampler()(logits[2:3], [seeded], [solo_gen]).token_ids[0] for _ in range(2)]
    assert solo[0] == alone[0]
    assert [t[2] for t in tokens] == solo and [t[5] for t in tokens] == solo

    # a different seed gives another sequence of tokens
    def sequence(seed: int) -> list[int]:
        g = gen(seed, dev)
        return [Sampler()(logits[2:3], [SamplingParams(seed=seed)], [g]).token_ids[0] for _ in range(20)]

    assert sequence(1) == sequence(1) and sequence(1) != sequence(2)


def test_logprobs_are_of_the_raw_distribution_with_rank_and_top_k(dev):
    logits = logits_rows(4, device=dev)
    params = [
        SamplingParams(temperature=0.0, logprobs=3),
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=5.0, top_k=20, logprobs=5, seed=4),
        SamplingParams(temperature=1.0, logprobs=0),
    ]
    out = sample(logits, params)
    lp = torch.log_softmax(logits, -1)
    # exact on the CPU; a GPU's log_softmax kernel may round differently for another batch size
    same = (lambda a, b: a == b) if dev.type == "cpu" else (lambda a, b: a == pytest.approx(b, abs=1e-5))
    assert out.logprobs[1] is None
    for i in (0, 2, 3):
        sampled, rank, top = out.logprobs[i]
        tok = out.token_ids[i]
        assert same(sampled, lp[i, tok].item())
        assert rank == int((lp[i] > lp[i, tok]).sum()) + 1
        ref = torch.topk(lp[i], params[i].logprobs)
        assert [t for t, _ in top] == ref.indices.tolist() and same([v for _, v in top], ref.values.tolist())
    assert out.logprobs[0][1] == 1 and out.logprobs[3][2] == []


@pytest.mark.parametrize("want_logprobs", [False, True])
def test_one_host_copy_for_tokens_and_one_for_logprobs(monkeypatch, want_logprobs, dev):
    copies = []
    real = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: copies.append(t.shape) or real(t))
    monkeypatch.setattr(torch.Tensor, "item", lambda t: pytest.fail("a per-row .item() host sync"))
    lp = 2 if want_logprobs else None
    params = [
        SamplingParams(temperature=0.0, logprobs=lp),
        SamplingParams(temperature=1.0, top_p=0.9, seed=1),
        SamplingParams(temperature=0.7, top_k=4, min_p=0.1),
        SamplingParams(temperature=1.0, logprobs=lp),
    ] * 8
    sample(logits_rows(32, device=dev), params)
    assert len(copies) == (2 if want_logprobs else 1)


def test_uniform_and_mixed_parameters_agree(dev):
    # the same rows sampled as one uniform batch (scalars) and inside a mixed batch (per-row tensors)
    logits = logits_rows(3, device=dev)
    p = SamplingParams(temperature=0.9, top_k=8, top_p=0.8, min_p=0.02, seed=11)
    uniform = sample(logits, [p] * 3).token_ids
    other = SamplingParams(temperature=0.3, top_k=2, seed=5)
    mixed = sample(torch.cat([logits, logits[:1]]), [p, p, p, other]).token_ids
    assert mixed[:3] == uniform


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_logits_sample_as_their_float32_upcast(dtype, dev):
    """The runner hands the sampler the model's own logits dtype: every path must give what the float32
    upcast of those logits gives (greedy, filtered random rows with a shared and a seeded generator,
    logprobs), bit for bit."""
    logits = logits_rows(8, device=dev).to(dtype)
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.7, top_p=0.9),
        SamplingParams(temperature=1.3, top_k=5, seed=3),
        SamplingParams(temperature=0.0, logprobs=4),
        SamplingParams(temperature=1.0, min_p=0.1, logprobs=2),
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.5),
        SamplingParams(temperature=0.0, top_k=2),
    ]
    low = sample(logits, params, seed=11)
    high = sample(logits.float(), params, seed=11)
    assert low.token_ids == high.token_ids
    assert low.logprobs == high.logprobs
    assert sample(logits, [SamplingParams(temperature=0.0)] * 8).token_ids == logits.float().argmax(-1).tolist()
