"""The greedy sampler's Triton argmax (``kernels/triton_argmax.py``) returns ``torch.argmax``'s index on
every row: random logits of the default bucket shapes, maxima tied within a lane, across lanes and across
chunks (the first wins), rows of -inf, a NaN; split and unsplit launches, 16- and 32-bit floats. Run under the
Triton interpreter on CPU; ``tests/gpu/test_triton_argmax_gpu.py`` runs the same cases on a GPU."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import run_cases_in_triton_interpreter


def argmax_cases() -> dict[str, torch.Tensor]:
    """name -> (B, V) logits whose argmax is unambiguous by torch's rule (first maximum)."""
    g = torch.Generator().manual_seed(0)
    cases = {
        "b64-v20000-bf16": torch.randn(64, 20000, generator=g).to(torch.bfloat16),
        "b1-v151936-bf16": torch.randn(1, 151936, generator=g).to(torch.bfloat16),
        "b3-v500-fp16-unsplit": torch.randn(3, 500, generator=g).to(torch.float16),
        "b5-v4099-fp32": torch.randn(5, 4099, generator=g),
    }
    ties = torch.zeros(6, 9000)
    ties[0, [7, 1031, 5000]] = 3.0  # the same lane (7 and 1031 = 7 + 1024), then another chunk
    ties[1, [5000, 12, 8999]] = 2.0  # the first maximum is not the first one written
    ties[2] = float("-inf")  # all -inf: index 0
    ties[3, 4000] = float("nan")  # NaN is the maximum
    ties[4, [2048, 2049]] = 1.0  # neighbouring lanes
    ties[5] = 1.0  # all equal: index 0
    cases["ties-b6-v9000-bf16"] = ties.to(torch.bfloat16)
    return cases


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    pytest.importorskip("triton")
    return run_cases_in_triton_interpreter(
        "tests.kernels.argmax_interpreted", argmax_cases(), tmp_path_factory.mktemp("argmax")
    )


@pytest.mark.parametrize("name", list(argmax_cases()))
def test_triton_argmax_is_torch_argmax_in_interpreter(name, interpreted):
    want = argmax_cases()[name].argmax(dim=-1)
    first, second = interpreted[name]
    assert first.dtype == torch.int64
    assert torch.equal(first, want), (first, want)
    assert torch.equal(second, want)


def test_split_columns_cover_every_column_with_whole_blocks():
    pytest.importorskip("triton")
    from attnserve.kernels.triton_argmax import BLOCK, split_columns

    assert split_columns(64, 151936, 132) == (9, 17408)  # the Qwen3-0.6B batch-64 step
    assert split_columns(1, 151936, 132) == (149, 1024)
    assert split_columns(3, 500, 132) == (1, 1024)
    for rows, cols in [(1, 1), (7, 1025), (512, 151936), (64, 128256), (2, 3 * BLOCK)]:
        splits, chunk = split_columns(rows, cols, 132)
        assert chunk % BLOCK == 0 and (splits - 1) * chunk < cols <= splits * chunk, (rows, cols, splits, chunk)
