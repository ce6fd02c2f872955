"""The fused greedy LM head (``kernels/triton_greedy_head.py``) on a GPU: on the interpreter test's cases and on
decode shapes (Qwen3's and Llama 3's vocabularies, 1..64 rows, every candidate tile) its tokens are
``torch.argmax`` of the logits it computes and those logits agree with ``F.linear`` (the GEMV plan's check);
replayed in a CUDA graph with new hidden states; and in the engine on the default model, greedy generation with
the fused head forced at every row count gives the tokens of the LM head + argmax path."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.nn.functional as F

from tests.gpu.test_cuda_graphs import default_gguf  # noqa: F401 (fixture)
from tests.kernels.test_triton_greedy_head import greedy_head_cases, masked_argmax, masked_cases

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA")


def _check(hidden, weight, cfg=None):
    from attnserve.gemv.timing import agrees
    from attnserve.kernels.triton_greedy_head import greedy_head

    logits = torch.empty(hidden.shape[0], weight.shape[0], dtype=weight.dtype, device=weight.device)
    tokens = greedy_head(hidden, weight, cfg, logits_out=logits)
    assert torch.equal(tokens, logits.argmax(dim=-1))
    assert torch.equal(greedy_head(hidden, weight, cfg), tokens)
    if not weight.isnan().any():
        assert agrees(logits, F.linear(hidden, weight))
    return tokens


@pytest.mark.parametrize("name", list(greedy_head_cases()))
def test_interpreter_cases_on_cuda(name):
    from attnserve.kernels.triton_greedy_head import GreedyHeadConfig

    hidden, weight, fields = greedy_head_cases()[name]
    tokens = _check(hidden.cuda(), weight.cuda(), GreedyHeadConfig(*fields) if fields else None)
    if name == "ties-m4-n600":
        assert tokens.tolist() == [5, 0, 5, 5]
    if name == "nan-m4-n600":
        assert tokens.tolist() == [400] * 4


@pytest.mark.parametrize("rows", [1, 16, 64])
@pytest.mark.parametrize("vocab,dim", [(151936, 1024), (128256, 4096)])
def test_decode_shapes_every_candidate(rows, vocab, dim):
    from attnserve.kernels.triton_greedy_head import CANDIDATES

    g = torch.Generator(device="cuda").manual_seed(rows)
    hidden = torch.randn(rows, dim, device="cuda", generator=g).to(torch.bfloat16)
    weight = (torch.randn(vocab, dim, device="cuda", generator=g) / dim**0.5).to(torch.bfloat16)
    for cfg in CANDIDATES:
        _check(hidden, weight, cfg)


def test_in_a_cuda_graph_with_new_hidden_states():
    from attnserve.kernels.triton_greedy_head import greedy_head

    g = torch.Generator(device="cuda").manual_seed(0)
    weight = (torch.randn(151936, 1024, device="cuda", generator=g) / 32).to(torch.bfloat16)
    static = torch.randn(64, 1024, device="cuda", generator=g).to(torch.bfloat16)
    greedy_head(static, weight)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = greedy_head(static, weight)
    for _ in range(3):
        static.copy_(torch.randn(64, 1024, device="cuda", generator=g).to(torch.bfloat16))
        graph.replay()
        assert torch.equal(out, greedy_head(static, weight))


class ForcedFusedHead:
    """The engine's fused greedy head forced at every row count 1..64 (the default tile), recording for each call
    whether it gave tokens and whether a grammar bitmask came with it: ``GreedyHead(ForcedFusedHead(runner))``."""

    def __init__(self, runner) -> None:
        from attnserve.gemv.choices import GreedyChoice
        from attnserve.gemv.methods import FusedGreedyHead
        from attnserve.gemv.plan import lm_head
        from attnserve.kernels.triton_greedy_head import GreedyHeadConfig

        head = lm_head(runner.model)
        n, k = head.weight.shape
        plan = runner.gemv_plan
        plan.greedy = {m: GreedyChoice(n, k, m, 0.0, "forced", 0.0, GreedyHeadConfig(), True) for m in range(1, 65)}
        self.head = FusedGreedyHead(head, plan.greedy_table())
        self.calls: list[tuple[bool, bool]] = []  # (tokens given, a bitmask applied)

    def covers(self, rows: int) -> bool:
        return self.head.covers(rows)

    def warm_masked(self) -> None:
        self.head.warm_masked()

    def __call__(self, hidden, grammar=None):
        tokens = self.head(hidden, grammar)
        self.calls.append((tokens is not None, grammar is not None))
        return tokens


def test_engine_greedy_tokens_with_the_fused_head_forced(default_gguf):
    from attnserve import LLM, SamplingParams
    from attnserve.model_executor.greedy_head import GreedyHead

    llm = LLM(
        default_gguf,
        dtype="bfloat16",
        device="cuda",
        attention_backend="TRITON_ATTN",
        kv_cache_memory=1 << 30,
        max_num_seqs=16,
        use_skinny_gemm=True,
    )
    runner = llm.engine.runner
    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time", "1, 2, 3, 4,"]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    runner.greedy_head = GreedyHead()
    plain = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    forced = ForcedFusedHead(runner)
    runner.greedy_head = GreedyHead(forced)
    fused = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert len(forced.calls) >= 24 and all(given for given, _ in forced.calls)
    assert fused == plain
    del llm
    gc.collect()
    torch.cuda.empty_cache()


@pytest.mark.parametrize("name", list(masked_cases()))
def test_masked_interpreter_cases_on_cuda(name):
    """With a grammar bitmask the head's tokens are the argmax of the masked logits it computes (the PyTorch
    definition of the bitmask), on the interpreter test's cases."""
    from attnserve.kernels.triton_greedy_head import GreedyHeadConfig, greedy_head

    hidden, weight, fields, words, index, tokens = (
        t.cuda() if isinstance(t, torch.Tensor) else t for t in masked_cases()[name]
    )

    cfg = GreedyHeadConfig(*fields) if fields else None
    logits = torch.empty(hidden.shape[0], weight.shape[0], dtype=weight.dtype, device="cuda")
    got = greedy_head(hidden, weight, cfg, logits_out=logits, mask_words=words, mask_index=index, mask_tokens=tokens)
    assert torch.equal(got, masked_argmax(logits, words, index, tokens))
    assert torch.equal(greedy_head(hidden, weight, cfg, mask_words=words, mask_index=index, mask_tokens=tokens), got)


@pytest.mark.parametrize("rows", [16, 64])
def test_masked_decode_shape(rows):
    """Qwen3's LM head at 16 and 64 rows, every candidate tile, half the rows constrained by random bitmasks."""
    from attnserve.kernels.triton_greedy_head import CANDIDATES, greedy_head

    g = torch.Generator(device="cuda").manual_seed(rows)
    vocab, dim, tokens = 151936, 1024, 151669
    hidden = torch.randn(rows, dim, device="cuda", generator=g).to(torch.bfloat16)
    weight = (torch.randn(vocab, dim, device="cuda", generator=g) / dim**0.5).to(torch.bfloat16)
    words = torch.randint(-(2**31), 2**31 - 1, (rows // 2, (tokens + 31) // 32), device="cuda", generator=g)
    words = words.to(torch.int32)
    index = torch.full((rows,), -1, dtype=torch.int32, device="cuda")
    index[::2] = torch.arange(rows // 2, dtype=torch.int32, device="cuda")
    for cfg in CANDIDATES:
        logits = torch.empty(rows, vocab, dtype=torch.bfloat16, device="cuda")
        got = greedy_head(
            hidden, weight, cfg, logits_out=logits, mask_words=words, mask_index=index, mask_tokens=tokens
        )
        assert torch.equal(got, masked_argmax(logits, words, index, tokens)), cfg
