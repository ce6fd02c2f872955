"""Penalties and the other logits rules on CUDA:

* the Triton penalties kernel equals the PyTorch definition bit for bit (on the CPU and on CUDA), at the
  Qwen3-0.6B vocabulary, for every combination of penalties, rows in any order and a subset of them;
* the whole logits-processing stage on CUDA equals the same stage on the CPU;
* on the default model with CUDA graphs and async scheduling, a batch mixing requests with and without
  penalties gives each request its tokens alone, equal to the synchronous engine's, and a decode step with
  penalties, bias, min_tokens and multi-token bad words makes no synchronizing CUDA call.
"""

from __future__ import annotations

import gc
import itertools

import pytest
import torch

from attnserve import LLM, SamplingParams
from attnserve.core.step import ScheduledRequest
from attnserve.kernels.penalties import apply_penalties, apply_penalties_torch
from attnserve.model_executor.logits_processors import LogitsProcessors
from tests.gpu.test_async_scheduling_gpu import _checked_decode_steps
from tests.gpu.test_cuda_graphs import default_gguf  # noqa: F401 (fixture)

pytestmark = pytest.mark.gpu

VOCAB = 151936


def _state(rows: int, slots: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, VOCAB, generator=g) * 8
    logits[:, ::977] = float("-inf")
    logits[:, 5::1013] = 0.0
    counts = (torch.rand(slots, VOCAB, generator=g) < 0.002).int() * torch.randint(
        1, 5, (slots, VOCAB), generator=g, dtype=torch.int32
    )
    mask = torch.rand(slots, VOCAB, generator=g) < 0.003
    return logits, counts, mask


@pytest.mark.parametrize("flags", list(itertools.product([False, True], repeat=3)))
@pytest.mark.parametrize("subset", [False, True])
def test_triton_penalties_equal_the_definition(flags, subset):
    if not any(flags):
        pytest.skip("nothing to apply")
    logits, counts, mask = _state(64, 80)
    rows = torch.randperm(64)[: 40 if subset else 64]
    slots = torch.randperm(80)[: len(rows)]
    g = torch.Generator().manual_seed(1)
    pres, freq, rep = (
        (torch.rand(len(rows), generator=g) * 4 - 2) if flags[0] else None,
        (torch.rand(len(rows), generator=g) * 4 - 2) if flags[1] else None,
        (torch.rand(len(rows), generator=g) * 1.5 + 0.25) if flags[2] else None,
    )
    ref = logits.clone()
    apply_penalties_torch(ref, rows, slots, counts, mask, pres, freq, rep)
    dev = lambda t: None if t is None else t.cuda()  # noqa: E731
    on_cuda = logits.cuda()
    apply_penalties(on_cuda, rows.cuda(), slots.cuda(), counts.cuda(), mask.cuda(), dev(pres), dev(freq), dev(rep))
    assert torch.equal(on_cuda.cpu(), ref)
    torch_cuda = logits.cuda()
    apply_penalties_torch(
        torch_cuda, rows.cuda(), slots.cuda(), counts.cuda(), mask.cuda(), dev(pres), dev(freq), dev(rep)
    )
    assert torch.equal(torch_cuda.cpu(), ref)
    assert not torch.equal(ref, logits)


def _req(rid, prompt, output, pending=False, **params):
    words = params.pop("bad_words_ids", None)
    sp = SamplingParams(temperature=0, max_tokens=1000, **params)
    sp.bad_words_token_ids = words
    known = output[:-1] if pending else output
    return ScheduledRequest(
        rid,
        [0],
        0,
        [],
        sp,
        True,
        num_output_tokens=len(output),
        eos_token_id=2,
        prompt_token_ids=prompt,
        output_token_ids=known,
        recent_output_ids=known[-4:],
        output_pending=pending,
    )


def test_the_logits_stage_on_cuda_equals_the_cpu():
    logits, _, _ = _state(4, 1, seed=3)
    reqs = [
        _req(
            "a",
            [5, 17, 17, 300],
            [17, 900, 900],
            presence_penalty=0.5,
            frequency_penalty=0.75,
            repetition_penalty=1.3,
            logit_bias={3: 2.5},
        ),
        _req("b", [7], [9]),
        _req(
            "c",
            [1, 2],
            [3, 5, 6],
            pending=True,
            min_tokens=5,
            stop_token_ids=[11],
            allowed_token_ids=list(range(0, VOCAB, 3)),
            bad_words=["x"],
            bad_words_ids=[[77], [5, 6, 88], [6, 99]],
        ),
        _req("d", [4, 4], [4], repetition_penalty=0.8),
    ]
    last = {"c": 1}
    outs = []
    for device in ("cpu", "cuda"):
        lp = LogitsProcessors(torch.device(device))
        lp.admit(reqs, VOCAB)
        outs.append(lp(logits.to(device), reqs, torch.tensor([0, 6]).to(device), last).cpu())
    assert torch.equal(outs[0], outs[1])
    assert outs[0][2, 99].isneginf() and outs[0][2, 88].isneginf() and outs[0][2, 2].isneginf()


PROMPTS = ["The capital of France is", "def fibonacci(n):", "1, 2, 3, 4,", "Once upon a time"]
PARAMS = [
    SamplingParams(
        temperature=0.0,
        max_tokens=32,
        ignore_eos=True,
        presence_penalty=0.6,
        frequency_penalty=0.4,
        repetition_penalty=1.2,
    ),
    SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True),
    SamplingParams(temperature=0.0, max_tokens=32, min_tokens=20, logit_bias={11: 1.5}, bad_words=[" 5, 6", "7"]),
    SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True, repetition_penalty=1.5),
]


def test_penalized_batch_on_cuda_graphs_with_async_scheduling(default_gguf):  # noqa: F811
    args = dict(
        dtype="float32", device="cuda", attention_backend="TRITON_ATTN", kv_cache_memory=1 << 30, max_num_seqs=16
    )
    llm = LLM(default_gguf, **args)
    assert llm.engine.async_scheduling and llm.engine.runner.cuda_graphs is not None
    checked = _checked_decode_steps(llm.engine.runner)
    together = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, PARAMS)]
    assert checked[0] >= 31
    alone = [llm.generate([p], sp)[0].outputs[0].token_ids for p, sp in zip(PROMPTS, PARAMS)]
    assert together == alone
    plain = llm.generate([PROMPTS[0]], PARAMS[1])[0].outputs[0].token_ids
    assert together[0] != plain
    del llm
    gc.collect()
    sync = LLM(default_gguf, async_scheduling=False, **args)
    assert [o.outputs[0].token_ids for o in sync.generate(PROMPTS, PARAMS)] == together
