"""The fused greedy LM head (``kernels/triton_greedy_head.py``) returns ``torch.argmax`` of the logits it computes,
and those logits are the LM head's: random shapes (1, 3, 17, 40, 64 rows: the tile transposed up to 32 rows, not past; K a multiple of the step or not; a vocabulary
that is no multiple of the tile), 16-bit dtypes, two tiles, and maxima tied within a tile and across tiles (the
first wins), a NaN logit; and with a grammar bitmask (structured outputs) over all rows or some, padded past the
grammar's vocabulary, its tokens are the argmax of the masked logits. Run under the Triton interpreter on CPU; ``tests/gpu/test_greedy_head_gpu.py`` runs
them on a GPU."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import run_cases_in_triton_interpreter


def greedy_head_cases() -> dict[str, tuple[torch.Tensor, torch.Tensor, tuple | None]]:
    """name -> (hidden (M, K), weight (N, K), GreedyHeadConfig fields or None for the default)."""
    g = torch.Generator().manual_seed(0)

    def rand(m: int, n: int, k: int, dtype: torch.dtype, cfg: tuple | None = None):
        return (torch.randn(m, k, generator=g).to(dtype), (torch.randn(n, k, generator=g) / k**0.5).to(dtype), cfg)

    cases = {
        "m1-n1000-k64-bf16": rand(1, 1000, 64, torch.bfloat16),
        "m3-n4099-k100-fp16": rand(3, 4099, 100, torch.float16),
        "m64-n777-k128-bf16": rand(64, 777, 128, torch.bfloat16),
        "m40-n500-k100-fp16-n256": rand(40, 500, 100, torch.float16, (256, 64, 8, 3)),
        "m17-n300-k96-bf16-n128k128": rand(17, 300, 96, torch.bfloat16, (128, 128, 8, 3)),
    }
    hidden = torch.ones(4, 32, dtype=torch.bfloat16)
    weight = torch.zeros(600, 32)
    weight[[5, 70, 513]] = 1.0  # equal maxima: in tile 0, tile 1 and the last tile; the first wins
    weight[[130, 131]] = 0.5
    hidden[1] = -1.0  # row 1: the maximum (0) is every other column: the first one, 0
    cases["ties-m4-n600"] = (hidden, weight.to(torch.bfloat16), None)
    nan_weight = weight.clone()
    nan_weight[400] = float("nan")  # NaN counts as the maximum, as in torch.argmax
    cases["nan-m4-n600"] = (hidden, nan_weight.to(torch.bfloat16), None)
    return cases


def masked_cases() -> dict[str, tuple]:
    """name -> (hidden (M, K), weight (N, K), config fields or None, mask_words (C, W) int32, mask_index (M,) int32
    or None, mask_tokens): random words; a vocabulary padded past the grammar's; some rows unconstrained; a row
    that allows one token only; a NaN logit the mask blocks."""
    g = torch.Generator().manual_seed(1)

    def case(m, n, k, tokens, constrained, cfg=None, dtype=torch.bfloat16):
        hidden = torch.randn(m, k, generator=g).to(dtype)
        weight = (torch.randn(n, k, generator=g) / k**0.5).to(dtype)
        words = torch.randint(
            -(2**31), 2**31 - 1, (len(constrained), (tokens + 31) // 32), dtype=torch.int32, generator=g
        )
        index = None
        if constrained != list(range(m)):
            index = torch.full((m,), -1, dtype=torch.int32)
            index[constrained] = torch.arange(len(constrained), dtype=torch.int32)
        return hidden, weight, cfg, words, index, tokens

    cases = {
        "all-rows-m5-n1000": case(5, 1000, 64, 1000, list(range(5))),
        "padded-m3-n700-tokens650": case(3, 700, 96, 650, list(range(3)), (128, 64, 4, 4), torch.float16),
        "some-rows-m40-n500": case(40, 500, 100, 500, [0, 7, 39]),
        "some-rows-m17-n300": case(17, 300, 96, 290, [2, 3, 16], (128, 128, 8, 3)),
    }
    hidden, weight, cfg, words, index, tokens = case(4, 600, 32, 600, [0, 1, 2, 3])
    words.zero_()
    words[0, 555 // 32] = 1 << (555 % 32)  # row 0: only token 555
    weight[123] = float("nan")  # blocked in every row: the NaN must not win
    cases["one-token-nan-m4-n600"] = (hidden, weight, cfg, words, index, tokens)
    return cases


def masked_argmax(logits: torch.Tensor, words: torch.Tensor, index: torch.Tensor | None, tokens: int) -> torch.Tensor:
    """The unfused path's tokens: the PyTorch definition of the bitmask applied to the logits, then argmax."""
    from attnserve.structured_output.bitmask import GrammarBitmask, apply_grammar_bitmask_torch

    rows = None if index is None else torch.nonzero(index >= 0).flatten()
    masked = apply_grammar_bitmask_torch(logits.float(), GrammarBitmask(words, rows, tokens))
    return masked.argmax(dim=-1)


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    pytest.importorskip("triton")
    return run_cases_in_triton_interpreter(
        "tests.kernels.greedy_head_interpreted",
        {**greedy_head_cases(), **masked_cases()},
        tmp_path_factory.mktemp("greedy_head"),
    )


@pytest.mark.parametrize("name", list(greedy_head_cases()))
def test_greedy_head_is_argmax_of_its_logits_in_interpreter(name, interpreted):
    hidden, weight, _ = greedy_head_cases()[name]
    tokens, tokens_with_logits, logits = interpreted[name]
    assert tokens.dtype == torch.int64 and tokens.shape == (hidden.shape[0],)
    assert torch.equal(tokens, logits.argmax(dim=-1)), (tokens, logits.argmax(dim=-1))
    assert torch.equal(tokens_with_logits, tokens)
    want = (hidden.float() @ weight.float().T).to(weight.dtype)  # the LM head's logits, rounded once
    torch.testing.assert_close(logits, want, atol=1e-2, rtol=1e-2, equal_nan=True)


@pytest.mark.parametrize("name", list(masked_cases()))
def test_masked_greedy_head_is_argmax_of_the_masked_logits_in_interpreter(name, interpreted):
    hidden, weight, _, words, index, tokens = masked_cases()[name]
    got, got_with_logits, logits = interpreted[name]
    want = masked_argmax(logits, words, index, tokens)
    assert torch.equal(got, want), (got, want)
    assert torch.equal(got_with_logits, got)
    if index is not None:  # an unconstrained row keeps its plain argmax
        free = index < 0
        assert torch.equal(got[free], logits.float()[free].argmax(dim=-1))
    assert torch.equal((hidden.float() @ weight.float().T).to(weight.dtype).isnan(), logits.isnan())


def test_masked_one_token_row_takes_it_and_the_blocked_nan_never_wins(interpreted):
    tokens = interpreted["one-token-nan-m4-n600"][0]
    assert tokens[0].item() == 555 and 123 not in tokens.tolist()


def test_tied_and_nan_cases_pick_the_first_maximum(interpreted):
    assert interpreted["ties-m4-n600"][0].tolist() == [5, 0, 5, 5]
    assert interpreted["nan-m4-n600"][0].tolist() == [400, 400, 400, 400]


def test_bad_inputs_name_the_value():
    pytest.importorskip("triton")
    from attnserve.kernels.triton_greedy_head import greedy_head

    with pytest.raises(ValueError, match="float16 or bfloat16"):
        greedy_head(torch.zeros(1, 8), torch.zeros(4, 8))
    with pytest.raises(ValueError, match="1..64 rows.*M=65"):
        greedy_head(torch.zeros(65, 8, dtype=torch.bfloat16), torch.zeros(4, 8, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"\(2, 8\) and \(4, 9\)"):
        greedy_head(torch.zeros(2, 8, dtype=torch.bfloat16), torch.zeros(4, 9, dtype=torch.bfloat16))
    h, w = torch.zeros(3, 8, dtype=torch.bfloat16), torch.zeros(4, 8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="2 bitmask rows for 3 hidden rows"):
        greedy_head(h, w, mask_words=torch.zeros(2, 1, dtype=torch.int32), mask_tokens=4)
    with pytest.raises(ValueError, match=r"mask_index must be \(3,\) int32, got \(3,\) torch.int64"):
        greedy_head(h, w, mask_words=torch.zeros(2, 1, dtype=torch.int32), mask_index=torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match="int32 matrix"):
        greedy_head(h, w, mask_words=torch.zeros(3, 1, dtype=torch.int64))
