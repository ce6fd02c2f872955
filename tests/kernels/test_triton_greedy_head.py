"""The fused greedy LM head (``kernels/triton_greedy_head.py``) returns ``torch.argmax`` of the logits it computes,
and those logits are the LM head's: random shapes (1, 3, 17, 40, 64 rows: the tile transposed up to 32 rows, not past; K a multiple of the step or not; a vocabulary
that is no multiple of the tile), 16-bit dtypes, two tiles, and maxima tied within a tile and across tiles (the
first wins), a NaN logit. Run under the Triton interpreter on CPU; ``tests/gpu/test_greedy_head_gpu.py`` runs
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


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    pytest.importorskip("triton")
    return run_cases_in_triton_interpreter(
        "tests.kernels.greedy_head_interpreted", greedy_head_cases(), tmp_path_factory.mktemp("greedy_head")
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
