"""The greedy sampler's Triton argmax on a GPU: ``torch.argmax``'s index on every row of the interpreter test's
cases and of random logits in the decode buckets' shapes (Qwen3's and Llama 3's vocabularies), eagerly and
replayed in a CUDA graph with new logits each time (the split counters reset themselves). Prints both
kernels' times (not asserted: ``benchmarks/gpu/bench_argmax.py`` measures them)."""

from __future__ import annotations

import pytest
import torch

from tests.kernels.test_triton_argmax import argmax_cases

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA")


@pytest.mark.parametrize("name", list(argmax_cases()))
def test_argmax_cases_on_cuda(name):
    from attnserve.kernels.triton_argmax import argmax

    x = argmax_cases()[name].cuda()
    for _ in range(2):
        assert torch.equal(argmax(x), x.argmax(dim=-1))


@pytest.mark.parametrize("rows", [1, 2, 16, 64, 512])
@pytest.mark.parametrize("vocab,dtype", [(151936, torch.bfloat16), (128256, torch.bfloat16), (32000, torch.float32)])
def test_argmax_of_decode_shapes_eager_and_in_a_graph(rows, vocab, dtype):
    from attnserve.kernels.triton_argmax import argmax

    g = torch.Generator(device="cuda").manual_seed(rows)
    x = torch.randn(rows, vocab, device="cuda", generator=g).to(dtype)
    assert torch.equal(argmax(x), x.argmax(dim=-1))
    static = x.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = argmax(static)
    for _ in range(3):
        static.copy_(torch.randn(rows, vocab, device="cuda", generator=g).to(dtype))
        graph.replay()
        assert torch.equal(out, static.argmax(dim=-1))
