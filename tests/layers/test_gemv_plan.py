"""GemvPlan without a GPU: row counts -> bucket choices, the launch configurations it tries, the layers it
reaches, and the switch being inert on CPU. (Measured plans and graphs with Triton GEMVs: tests/gpu.)"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from attnserve.layers.gemv_plan import (  # noqa: E402
    DECODE_MS, MAX_ROWS, GemvChoice, GemvPlan, candidate_configs, gemv_layers, sweep_configs,
)
from attnserve.layers.triton_gemv import GemvConfig, check_config  # noqa: E402
from tests.layers.test_triton_gemv import REAL_SHAPES  # noqa: E402


def _plan(n: int, k: int, use: dict[int, bool]) -> GemvPlan:
    return GemvPlan({(n, k, m): GemvChoice(n, k, m, 10.0, 5.0, GemvConfig(16, 64 * m), u) for m, u in use.items()})


def test_table_maps_row_counts_to_the_next_measured_bucket():
    table = _plan(64, 128, {1: True, 2: False, 4: True, 8: False}).table(64, 128)
    assert len(table) == MAX_ROWS + 1 and table[0] is None
    assert [f is not None for f in table[1:]] == [True, False, True, True, False, False, False, False]
    assert table[3].keywords["config"] == table[4].keywords["config"] == GemvConfig(16, 256)
    assert table[1].keywords["config"] == GemvConfig(16, 64)


def test_table_is_none_where_cublas_always_wins_or_nothing_was_measured():
    plan = _plan(64, 128, {m: False for m in DECODE_MS})
    assert plan.table(64, 128) is None and plan.table(32, 128) is None


@pytest.mark.parametrize("n,k", REAL_SHAPES)
def test_tried_configs_are_valid_and_bounded(n, k):
    for m in DECODE_MS:
        cands, sweep = candidate_configs(n, k, m), sweep_configs(n, k, m)
        assert 3 <= len(cands) <= 6 and len(set(cands)) == len(cands)
        assert 10 <= len(sweep) <= 40 and len(set(sweep)) == len(sweep)
        for cfg in cands + sweep:
            check_config(cfg, m, torch.bfloat16)
            assert cfg.k_per_split(k) >= cfg.block_k
        for cfg in candidate_configs(n, k, m, elem_bytes=4) + sweep_configs(n, k, m, elem_bytes=4):
            assert not cfg.dot  # float32 stays on FMAs (an IEEE float32 dot is slow)


def _tiny(arch: str):
    from attnserve.models.llama import LlamaForCausalLM
    from tests.models.tiny import tiny_config

    return LlamaForCausalLM(tiny_config(arch), lambda spec, i: torch.nn.Identity())


@pytest.mark.parametrize("arch,head", [("llama", "lm_head"), ("llama3", "embed_tokens")])
def test_gemv_layers_are_the_linears_and_the_head_in_use(arch, head):
    model = _tiny(arch)
    names = {id(m): n for n, m in model.named_modules()}
    found = [names[id(m)] for m, _ in gemv_layers(model)]
    assert len(found) == 2 * 4 + 1 and found[-1] == head
    assert {f.split(".")[-1] for f in found[:-1]} == {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}


def test_apply_leaves_cublas_layers_untouched():
    model = _tiny("llama")
    plan = GemvPlan({(n, k, m): GemvChoice(n, k, m, 1.0, 2.0, GemvConfig(16, 64), False)
                     for n, k in {tuple(w.shape) for _, w in gemv_layers(model)} for m in DECODE_MS})
    plan.apply(model)
    assert all(m.gemv is None for m, _ in gemv_layers(model))
    assert "cuBLAS" in plan.summary()


def test_use_skinny_gemm_is_inert_without_cuda_graphs(tiny_model_dir):
    from attnserve import LLM

    llm = LLM(tiny_model_dir("llama"), device="cpu", attention_backend="CPU_ATTN", use_skinny_gemm=True)
    assert llm.engine.config.use_skinny_gemm
    assert all(m.gemv is None for m, _ in gemv_layers(llm.engine.runner.model))
