"""The grammar bitmask's Triton kernel (``kernels/triton_grammar_bitmask.py``) gives the PyTorch definition's
logits bit for bit (``bitmask.apply_grammar_bitmask_torch``): every row constrained or a subset of rows, a
vocabulary padded past the grammar's tokens, a width that is no multiple of the kernel's block or of 32, 16- and
32-bit logits. Run under the Triton interpreter on CPU; ``tests/gpu/test_structured_outputs_gpu.py`` runs the
same cases on a GPU."""

from __future__ import annotations

import pytest
import torch

from attnserve.structured_output.bitmask import GrammarBitmask, apply_grammar_bitmask_torch
from tests.helpers import run_cases_in_triton_interpreter


def bitmask_cases() -> dict[str, tuple]:
    """name -> (logits (R, V), words (C, W) int32, rows (C,) int64 or None, num_tokens)."""
    g = torch.Generator().manual_seed(0)

    def words(c: int, num_tokens: int, density: float) -> torch.Tensor:
        bits = torch.rand(c, (num_tokens + 31) // 32 * 32, generator=g) < density
        packed = (bits.view(c, -1, 32).long() << torch.arange(32)).sum(-1)  # int64 holds bit 31 unsigned
        return packed.to(torch.int32)  # wraps bit 31 into int32's sign

    return {
        "all-rows-bf16": (torch.randn(4, 5000, generator=g).bfloat16(), words(4, 5000, 0.5), None, 5000),
        "padded-vocab-f32": (torch.randn(3, 4500, generator=g), words(3, 4099, 0.3), None, 4099),
        "some-rows-f16": (
            torch.randn(6, 2100, generator=g).half(),
            words(2, 2100, 0.05),
            torch.tensor([1, 4]),
            2100,
        ),
        "one-token-allowed": (
            torch.randn(2, 33, generator=g),
            torch.tensor([[1 << 31, 0], [0, 1]], dtype=torch.int64).to(torch.int32),
            None,
            33,
        ),
    }


def expected(logits, words, rows, num_tokens) -> torch.Tensor:
    return apply_grammar_bitmask_torch(logits.clone(), GrammarBitmask(words, rows, num_tokens))


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    pytest.importorskip("triton")
    return run_cases_in_triton_interpreter(
        "tests.kernels.grammar_bitmask_interpreted", bitmask_cases(), tmp_path_factory.mktemp("bitmask")
    )


@pytest.mark.parametrize("name", list(bitmask_cases()))
def test_triton_bitmask_is_the_torch_definition_in_interpreter(name, interpreted):
    case = bitmask_cases()[name]
    got, want = interpreted[name], expected(*case)
    assert got.dtype == want.dtype and torch.equal(got, want)
    assert torch.isinf(want).any() and not torch.isinf(want).all()  # a case that masks something, not all


def test_torch_definition_masks_exactly_the_clear_bits():
    logits = torch.zeros(2, 40)
    words = torch.tensor([[0b101, 1 << 1]], dtype=torch.int32)
    out = apply_grammar_bitmask_torch(logits, GrammarBitmask(words, torch.tensor([0]), 36))
    assert torch.isfinite(out[0]).nonzero().flatten().tolist() == [0, 2, 33]  # tokens 36..39: past the grammar's
    assert torch.equal(out[1], torch.zeros(40))  # a row the bitmask does not list
