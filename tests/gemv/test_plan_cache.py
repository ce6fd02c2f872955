"""The GEMV plan on disk without a GPU: the shapes a plan measures, its key (stable, and changed by each input),
the choices' round trip through the JSON file, and a file that cannot be read being measured again. (A plan built
twice on a GPU, the second loaded: tests/gpu/test_skinny_gemm.py.)"""

from __future__ import annotations

import json
import logging

import pytest
import torch

pytest.importorskip("triton")

from attnserve.gemv.choices import GemvChoice, GreedyChoice, SiluMulChoice  # noqa: E402
from attnserve.gemv.plan import GemvPlan, plan_shapes  # noqa: E402
from attnserve.gemv.plan_cache import (  # noqa: E402
    KERNEL_FILES,
    cached_plan,
    code_files,
    code_version,
    key_inputs,
    load_plan,
    plan_key,
    plan_path,
    save_plan,
    source_hash,
)
from attnserve.gemv.plan_json import plan_from_dict, plan_to_dict  # noqa: E402
from attnserve.kernels.triton_gemv import GemvConfig  # noqa: E402
from attnserve.kernels.triton_greedy_head import GreedyHeadConfig  # noqa: E402

BASE = dict(
    gpu_name="NVIDIA H200",
    capability=(9, 0),
    sm_count=132,
    torch_version="2.13.0",
    triton_version="3.8.0",
    cuda_version="12.9",
    dtype="bfloat16",
    shapes=[("linear", 2048, 1024), ("down", 1024, 3072), ("gate_up", 6144, 1024), ("greedy", 151936, 1024)],
    rows=(1, 2, 4, 8, 16, 32, 48, 64),
    pdl=True,
    code="0" * 64,
)
CHANGED = dict(
    gpu_name="NVIDIA H100 80GB HBM3",
    capability=(9, 1),
    sm_count=114,
    torch_version="2.14.0",
    triton_version="3.9.0",
    cuda_version="13.0",
    dtype="float16",
    shapes=BASE["shapes"][:-1],
    rows=(1, 2, 4, 8),
    pdl=False,
    code="1" * 64,
    margin=-10.0,
    lt_margin=0.0,
)


def _plan() -> GemvPlan:
    """A plan of every record kind, with floats that only round-trip when written exactly."""
    return GemvPlan(
        choices={
            (64, 128, 1): GemvChoice(64, 128, 1, 0.1 + 0.2, 5.000000000000001, GemvConfig(16, 64, 2, 8, 3, True), True),
            (64, 128, 2): GemvChoice(64, 128, 2, 10.0, None, None, False, 9.123456789012345, True),
            (64, 128, 4): GemvChoice(64, 128, 4, 1e-300, 12.0, GemvConfig(32, 128), False, None, False),
        },
        seconds=12.345678901234567,
        silu_mul={(64, 32, 1): SiluMulChoice(64, 32, 1, 7.5, "cuBLAS", 3.25, GemvConfig(16, 64, 1, 4, 1), True)},
        swiglu={(128, 64, 1): SiluMulChoice(128, 64, 1, 7.5, "cuBLASLt + silu_and_mul", None, None, False)},
        greedy={1: GreedyChoice(1000, 64, 1, 20.0, "cuBLAS + argmax", 15.0, GreedyHeadConfig(128, 64, 4, 4), True)},
    )


def _record_without_config() -> dict:
    """A fused greedy head chosen without its tile: not a plan."""
    return {**plan_to_dict(_plan())["greedy"][0], "config": None}


# ------------------------------------------------------------------------------------------------ the key
def test_key_is_stable_for_the_same_inputs():
    assert plan_key(key_inputs(**BASE)) == plan_key(key_inputs(**dict(reversed(list(BASE.items())))))
    assert len(plan_key(key_inputs(**BASE))) == 64
    reordered = dict(reversed(list(key_inputs(**BASE).items())))  # canonical JSON: key order does not matter
    assert plan_key(reordered) == plan_key(key_inputs(**BASE))


@pytest.mark.parametrize("name", list(CHANGED))
def test_key_changes_with_each_input(name):
    assert plan_key(key_inputs(**{**BASE, name: CHANGED[name]})) != plan_key(key_inputs(**BASE))


def test_key_changes_with_the_margins_as_they_are_now(monkeypatch):
    """A test that forces Triton (MARGIN -10) must not load the plan measured with the real margin."""
    from attnserve.gemv import choices

    before = plan_key(key_inputs(**BASE))
    monkeypatch.setattr(choices, "MARGIN", -10.0)
    assert plan_key(key_inputs(**BASE)) != before


def test_code_version_hashes_the_plans_sources(tmp_path):
    files = code_files()
    names = {p.relative_to(files[0].parents[1]).as_posix() for p in files}
    assert {"gemv/plan.py", "gemv/measure.py", "gemv/choices.py", "gemv/tiles.py", *KERNEL_FILES} <= names
    assert all(p.is_file() for p in files) and len(code_version()) == 64
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "b.py").write_text("y = 2\n")
    paths = [tmp_path / "a.py", tmp_path / "b.py"]
    before = source_hash(paths, tmp_path)
    assert source_hash(paths, tmp_path) == before
    (tmp_path / "b.py").write_text("y = 3\n")
    assert source_hash(paths, tmp_path) != before


def test_plan_shapes_are_the_kinds_a_plan_measures():
    from tests.gemv.test_plan import _tiny

    from attnserve.gemv.plan import lm_head, swiglu_mlps

    model = _tiny("llama")
    kinds = plan_shapes(model)
    mlp = swiglu_mlps(model)[0]
    assert ("down", *mlp.down_proj.weight.shape) in kinds and ("gate_up", *mlp.gate_up_proj.weight.shape) in kinds
    linear = [(n, k) for kind, n, k in kinds if kind == "linear"]
    assert len(linear) == len(set(linear)) == 4 + 1  # qkv, o, gate/up, down, the LM head
    assert not any(kind == "greedy" for kind, *_ in kinds)  # float32: no fused greedy head is timed
    assert plan_shapes(model.to(torch.bfloat16))[-1] == ("greedy", *lm_head(model).weight.shape)


# ------------------------------------------------------------------------------------------------ the file
def test_choices_round_trip_through_json_exactly(tmp_path):
    plan = _plan()
    data = json.loads(json.dumps(plan_to_dict(plan)))
    assert plan_from_dict(data) == plan
    path = plan_path(tmp_path, "k")
    assert path == tmp_path / "gemv" / "k.json"
    assert save_plan(path, plan, key_inputs(**BASE))
    loaded = load_plan(path)
    assert loaded == plan and loaded.choices[(64, 128, 1)].cublas_us == 0.1 + 0.2
    assert json.loads(path.read_text())["inputs"] == key_inputs(**BASE)
    assert [p.name for p in path.parent.iterdir()] == ["k.json"]  # no temporary file left


def test_a_loaded_plan_installs_the_same_tables():
    plan = _plan()
    loaded = plan_from_dict(plan_to_dict(plan))
    assert loaded.table(64, 128)[1].keywords == plan.table(64, 128)[1].keywords
    assert loaded.greedy_table()[1].keywords == plan.greedy_table()[1].keywords


def test_no_file_is_no_plan_without_a_warning(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="attnserve.gemv"):
        assert load_plan(tmp_path / "gemv" / "none.json") is None
    assert caplog.records == []


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        "",
        "[]",
        '{"plan": {"format": 1}}',
        '{"plan": {"format": 99, "seconds": 1, "choices": [], "silu_mul": [], "swiglu": [], "greedy": []}}',
        '{"plan": {"format": 1, "seconds": 1, "choices": [{"n": 1}], "silu_mul": [], "swiglu": [], "greedy": []}}',
        json.dumps({"plan": {**plan_to_dict(GemvPlan()), "greedy": [_record_without_config()]}}),
    ],
)
def test_a_corrupt_file_is_measured_again_and_rewritten(tmp_path, caplog, text):
    path = plan_path(tmp_path, "k")
    path.parent.mkdir(parents=True)
    path.write_text(text)
    measured = []

    def measure():
        measured.append(1)
        return _plan()

    with caplog.at_level(logging.INFO, logger="attnserve.gemv"):
        plan, loaded = cached_plan(path, key_inputs(**BASE), measure)
    assert (plan, loaded, measured) == (_plan(), False, [1])
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and warnings[0].startswith(f"GEMV plan cache {path} ")
    assert warnings[0].endswith("; measuring again")
    assert caplog.records[-1].getMessage().startswith("GEMV plan measured in ")
    assert caplog.records[-1].getMessage().endswith(f", saved to {path}")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="attnserve.gemv"):
        again, loaded = cached_plan(path, key_inputs(**BASE), measure)
    assert (again, loaded, measured) == (_plan(), True, [1])  # the rewritten file: no timing
    assert [r.getMessage() for r in caplog.records] == [
        f"GEMV plan loaded from {path} (no timing; measuring it took 12.3 s)"
    ]


def test_an_unwritable_cache_costs_a_warning_only(tmp_path, caplog):
    (tmp_path / "gemv").write_text("a file where the folder would be")
    path = plan_path(tmp_path, "k")
    with caplog.at_level(logging.INFO, logger="attnserve.gemv"):
        plan, loaded = cached_plan(path, key_inputs(**BASE), _plan)
    assert (plan, loaded) == (_plan(), False)
    messages = [r.getMessage() for r in caplog.records]
    assert messages[-2].startswith(f"GEMV plan not cached: cannot write {path}")
    assert messages[-1].endswith(" (not saved)")
