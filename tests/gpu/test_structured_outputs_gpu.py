"""Structured outputs on the GPU with the default model (CUDA graphs, async scheduling on, as by default):
JSON-schema outputs validate, and greedy unconstrained requests batched with constrained ones get the tokens
they get alone, in float32 (the bitmask staged with the step's inputs, applied to the logits); in bfloat16 with
--use-skinny-gemm the fused greedy head applies the bitmask inside it and gives the logits path's tokens."""

from __future__ import annotations

import json

import pytest

from attnserve import LLM, SamplingParams
from attnserve.core.structured_outputs import StructuredOutputsParams as S
from tests.structured_output.schemas import PROMPTS, SCHEMAS

pytestmark = pytest.mark.gpu
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("xgrammar")


@pytest.fixture(scope="module", params=[False, True], ids=["default", "skinny_gemm"])
def llm(request):
    # a third of the GPU: the float32 engine below starts while the last of these still holds its KV cache
    engine = LLM(dtype="bfloat16", use_skinny_gemm=request.param, gpu_memory_utilization=0.3)
    yield engine
    engine.engine.shutdown()


def test_json_schemas_validate_on_gpu(llm):
    params = [
        SamplingParams(
            temperature=0.0 if i < 10 else 0.8,
            seed=i,
            max_tokens=100,
            structured_outputs=S(json=SCHEMAS[i % 10], disable_any_whitespace=True),
        )
        for i in range(50)
    ]
    outs = llm.generate([PROMPTS[i % 10] for i in range(50)], params)
    for i, out in enumerate(outs):
        c = out.outputs[0]
        assert c.finish_reason == "stop", (i, c.text)
        jsonschema.validate(json.loads(c.text), SCHEMAS[i % 10])


@pytest.fixture(scope="module")
def llm_fp32():
    engine = LLM(dtype="float32")  # float32: batch-size-dependent kernels do not flip a greedy choice
    yield engine
    engine.engine.shutdown()


def test_unconstrained_rows_unchanged_by_constrained_neighbours(llm_fp32):
    llm = llm_fp32
    free = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    alone = [o.outputs[0].token_ids for o in llm.generate(free, [greedy] * 3)]
    constrained = SamplingParams(
        temperature=0.0, max_tokens=60, structured_outputs=S(json=SCHEMAS[0], disable_any_whitespace=True)
    )
    mixed = llm.generate(free + [PROMPTS[0]] * 2, [greedy] * 3 + [constrained] * 2)
    assert [o.outputs[0].token_ids for o in mixed[:3]] == alone
    for o in mixed[3:]:
        jsonschema.validate(json.loads(o.outputs[0].text), SCHEMAS[0])


def test_bitmask_is_filled_pinned_and_applied_on_the_device(llm_fp32):
    """The engine fills its bitmasks into pinned buffers; the device's masking of the listed rows equals the
    CPU's, padding past the grammar's vocabulary included."""
    import torch

    from attnserve.structured_output.bitmask import GrammarBitmask, apply_grammar_bitmask
    from attnserve.model_executor.forward_batch import PinnedStaging

    llm_fp32.generate(
        [PROMPTS[0]], SamplingParams(temperature=0.0, max_tokens=4, structured_outputs=S(json=SCHEMAS[0]))
    )
    structured = llm_fp32.engine.structured
    pinned = structured._process.pinned  # the grammar process's shared buffers, registered with CUDA
    assert structured.pin_memory and pinned is not None and pinned.is_pinned()
    gen = torch.Generator().manual_seed(0)
    vocab, tokens, rows = 1000, 900, [1, 4, 5]
    words = torch.randint(-(2**31), 2**31 - 1, (len(rows), (tokens + 31) // 32), dtype=torch.int32, generator=gen)
    host = GrammarBitmask(words.numpy(), torch.tensor(rows).numpy(), tokens, pinned=words.pin_memory())
    logits = torch.randn(8, vocab, generator=gen)
    want = apply_grammar_bitmask(logits.clone(), GrammarBitmask(words, torch.tensor(rows), tokens))
    got = apply_grammar_bitmask(logits.cuda(), host.to(PinnedStaging(torch.device("cuda"))))
    assert torch.equal(got.cpu(), want)


@pytest.mark.parametrize("name", ["all-rows-bf16", "padded-vocab-f32", "some-rows-f16", "one-token-allowed"])
def test_triton_bitmask_kernel_is_the_torch_definition(name):
    """One Triton launch (``kernels/triton_grammar_bitmask.py``) masks as the PyTorch definition does, bit for bit."""
    import torch

    from attnserve.structured_output.bitmask import GrammarBitmask, apply_grammar_bitmask, apply_grammar_bitmask_torch
    from tests.kernels.test_triton_grammar_bitmask import bitmask_cases, expected

    logits, words, rows, num_tokens = bitmask_cases()[name]
    dev = [None if t is None else t.cuda() for t in (logits, words, rows)]
    got = apply_grammar_bitmask(dev[0].clone(), GrammarBitmask(dev[1], dev[2], num_tokens))
    assert torch.equal(got.cpu(), expected(logits, words, rows, num_tokens))
    on_gpu = apply_grammar_bitmask_torch(dev[0].clone(), GrammarBitmask(dev[1], dev[2], num_tokens))
    assert torch.equal(got, on_gpu)


def test_pinned_bitmask_copied_by_the_runner_equals_the_host_fill(llm_fp32):
    """The grammar process accepts the deferred tokens and fills a pinned shared buffer; the runner's copy of it to the device
    (``GrammarBitmask.to``, non-blocking, past one full turn of the two buffers) equals a host-only manager's."""
    import numpy as np
    import torch

    from attnserve.core.step import ScheduledRequest, SchedulerOutput
    from attnserve.model_executor.forward_batch import PinnedStaging
    from attnserve.structured_output.manager import StructuredOutputManager

    engine = llm_fp32.engine
    assert engine.structured.pin_memory  # the engine's own manager fills pinned buffers
    tok = engine.tokenizer
    managers = [
        StructuredOutputManager(tok, engine.vocab_size, tok.eos_token_id, pin_memory=True),
        StructuredOutputManager(tok, engine.vocab_size, tok.eos_token_id),
    ]
    sched = SchedulerOutput(
        [ScheduledRequest(rid, [1], 0, [0], SamplingParams(), True) for rid in ("free", "json", "regex")]
    )
    staging = PinnedStaging(torch.device("cuda"))
    seen = []
    for m in managers:
        m.add("json", S(json=SCHEMAS[0]))
        m.add("regex", S(regex="[a-z]+@[a-z]+"))
        steps = []
        for _ in range(3):
            mask = m.start_bitmask(sched).result()
            assert (mask.pinned is not None and mask.pinned.is_pinned()) == (m is managers[0])
            staged = mask.to(staging)
            assert staged.words.is_cuda and staged.rows.is_cuda
            words = staged.words.cpu().numpy()
            steps.append((words, staged.rows.tolist()))
            first = [int(np.flatnonzero(np.unpackbits(w.view(np.uint8), bitorder="little"))[0]) for w in words]
            m.accept_tokens(list(zip(["json", "regex"], first)), defer=True)
        seen.append(steps)
        m.close()
    for (dev_words, dev_rows), (host_words, host_rows) in zip(*seen):
        assert np.array_equal(dev_words, host_words) and dev_rows == host_rows == [1, 2]


def test_fused_greedy_head_masks_as_the_logits_path():
    """With the fused greedy head forced at every row count (bfloat16, ``--use-skinny-gemm``), constrained greedy
    requests, alone in a step and beside an unconstrained one, get the tokens of the LM head + bitmask + argmax
    path: the head applies the bitmask inside it (``kernels/triton_greedy_head.py``)."""
    import gc

    import torch

    from attnserve.model_executor.greedy_head import GreedyHead
    from tests.gpu.test_greedy_head_gpu import ForcedFusedHead

    llm = LLM(
        dtype="bfloat16",
        attention_backend="TRITON_ATTN",
        kv_cache_memory=1 << 30,
        max_num_seqs=16,
        use_skinny_gemm=True,
    )
    runner = llm.engine.runner
    constrained = SamplingParams(
        temperature=0.0, max_tokens=48, structured_outputs=S(json=SCHEMAS[0], disable_any_whitespace=True)
    )
    free = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    prompts = [PROMPTS[0], PROMPTS[1], "Once upon a time", PROMPTS[2]]
    params = [constrained, constrained, free, constrained]
    runner.greedy_head = GreedyHead()
    plain = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    forced = ForcedFusedHead(runner)
    forced.warm_masked()
    runner.greedy_head = GreedyHead(forced)
    fused = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert fused == plain
    # every step that sampled a constrained row took the head with its bitmask: at least one per token of the
    # longest constrained output (the JSON ends early: 17 masked calls on the H200, 2026-12-03)
    longest = max(len(t) for t, p in zip(fused, params) if p is constrained)
    assert sum(masked for _, masked in forced.calls) >= longest
    llm.engine.shutdown()
    del llm
    gc.collect()
    torch.cuda.empty_cache()
