"""``--baseline vllm``: refused before any model loads where it cannot run; the runner gets the engine's exact
requests; its results become rows as the other baselines'. vLLM itself runs on the GPU machine
(benchmarks/gpu/vs_vllm.sh)."""

from __future__ import annotations

import importlib.util
import types

import pytest
import torch

from attnserve.benchmarks.latency import iteration_requests
from attnserve.benchmarks.latency import vllm_row as latency_vllm_row
from attnserve.benchmarks.requests import random_requests
from attnserve.benchmarks.roofline import Roofline
from attnserve.benchmarks.throughput import vllm_row as throughput_vllm_row
from attnserve.benchmarks.vllm_baseline import check_vllm_baseline, latency_spec, throughput_spec
from attnserve.entrypoints.cli.main import main
from attnserve.refusals import Refused

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
FACTS = types.SimpleNamespace(
    model="/m",
    load_format="dummy",
    dtype=torch.bfloat16,
    max_model_len=2304,
    max_num_seqs=256,
    seed=0,
    prompt_vocab_size=1000,
)
ROOFLINE = Roofline(copy_bandwidth=1e12, weight_bytes=10**9, kv_bytes_per_token=1000)


@pytest.mark.skipif(HAVE_VLLM, reason="vllm is installed here")
def test_missing_vllm_is_refused_with_the_flag_before_loading(capsys):
    with pytest.raises(Refused) as e:
        check_vllm_baseline("benchmarks/shapes/qwen3-0.6b")
    assert e.value.refusal.path == ("baseline",) and e.value.refusal.value == "vllm"
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "latency", "--baseline", "vllm", "--model", "/no/such/folder"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("attnserve bench latency: error: argument --baseline: 'vllm'")


def test_a_model_that_is_not_a_folder_is_refused(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())  # vllm "importable": the model check
    for model in (None, "model.gguf"):
        with pytest.raises(Refused) as e:
            check_vllm_baseline(model)
        assert e.value.refusal.allowed == "a --model folder with config.json"


def test_specs_carry_the_engine_settings_and_exact_requests():
    reqs = random_requests(5, 100, 20, 0.5, 1000, 3)
    spec = throughput_spec(FACTS, reqs)
    assert spec["engine"] == {
        "model": "/m",
        "load_format": "dummy",
        "dtype": "bfloat16",
        "max_model_len": 2304,
        "max_num_seqs": 256,
        "seed": 0,
        "tensor_parallel_size": 1,
    }
    assert spec["requests"] == [[r.prompt_token_ids, r.output_len] for r in reqs]
    lat = latency_spec(FACTS, batch_sizes=[1, 4], input_len=32, output_len=8, num_iters=2, num_iters_warmup=1, seed=7)
    # the runner rebuilds each iteration's prompts from these, as the engine's run built them
    p = lat["latency"]
    assert [
        r.prompt_token_ids
        for r in iteration_requests(4, p["input_len"], p["output_len"], p["vocab_size"], p["seed"], 2)
    ] == [r.prompt_token_ids for r in iteration_requests(4, 32, 8, 1000, 7, 2)]


def test_vllm_results_become_rows():
    reqs = random_requests(4, 10, 5, 0.0, 1000, 0)
    row = throughput_vllm_row({"elapsed_s": 2.0, "output_tokens": 20}, reqs, 0.5, ROOFLINE)
    assert (row.name, row.num_requests, row.total_tokens, row.output_tokens_per_s, row.num_steps) == (
        "vllm",
        4,
        60,
        10.0,
        None,
    )
    assert row.roofline.pct_of_limit == 25.0
    lrow = latency_vllm_row({"batch_size": 2, "ttft_s": [0.1, 0.1], "e2e_s": [0.5, 0.9]}, 16, 5, ROOFLINE)
    assert (lrow.name, lrow.batch_size) == ("vllm", 2)
    assert lrow.tpot_s["p50"] == pytest.approx(0.15)  # (0.4 / 4 + 0.8 / 4) / 2
