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


def test_one_compile_per_split_mode_whatever_the_row_count():
    """Eager steps sample any number of rows (a prefill step's requests): the split count is not specialized
    and the final reduction is as wide as a row's most chunks, so rows 1..2048 compile two kernels (split and
    unsplit), not one per power of two of the split count (those compiled inside timed runs). The vocabulary
    (257 chunks a row: a reduction 512 wide on a GPU of 65 SMs or more) is no other test's, so both compiles
    are this test's."""
    from attnserve.kernels.triton_argmax import _argmax_kernel, _num_sms, argmax, split_columns, splits_pad

    device = torch.cuda.current_device()
    num_sms, cols = _num_sms(torch.device("cuda", device)), 257 * 1024
    if num_sms < 65:
        pytest.skip("fewer than 65 SMs: the reduction's width is one other tests share")
    assert splits_pad(cols, num_sms) == 512
    x = torch.randn(2048, cols, device="cuda").to(torch.bfloat16)
    before = len(_argmax_kernel.device_caches[device][0])
    modes = set()
    for rows in (1, 2, 3, 5, 7, 16, 17, 64, 100, 112, 239, 256, 300, 2048):
        modes.add(split_columns(rows, cols, num_sms)[0] > 1)
        assert torch.equal(argmax(x[:rows]), x[:rows].argmax(dim=-1))
    assert modes == {True, False}
    assert len(_argmax_kernel.device_caches[device][0]) - before == 2
