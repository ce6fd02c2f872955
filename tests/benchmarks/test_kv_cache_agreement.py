"""The fp8-vs-16-bit KV-cache agreement evaluation, on CPU with a tiny model (the H200 run uses the default model)."""

from __future__ import annotations

import pytest

from attnserve.benchmarks.kv_cache_agreement import _prompt_ids, compare, run

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Why do cats purr?"]


def test_identical_engines_agree_exactly(tiny_model_dir):
    from attnserve import LLM

    kw = dict(device="cpu", dtype="float32", attention_backend="CPU_ATTN", num_gpu_blocks=64)
    a, b = LLM(tiny_model_dir("llama"), **kw), LLM(tiny_model_dir("llama"), **kw)
    figures = compare(a.engine, b.engine, _prompt_ids(a.engine, PROMPTS), 5)
    assert figures == {
        "positions": 15,
        "greedy_agreement": 1.0,
        "mean_kl": 0.0,
        "max_kl": 0.0,
        "first_divergence_mean": 5.0,
    }


@pytest.mark.parametrize("kv", ["fp8", "fp8_e5m2"])
def test_fp8_against_16_bit(tiny_model_dir, kv):
    result = run(
        tiny_model_dir("llama"), kv, "CPU_ATTN", num_tokens=4, device="cpu", prompts=PROMPTS, num_gpu_blocks=64
    )
    assert (result["attention_backend"], result["kv_cache_dtype"], result["positions"]) == ("CPU_ATTN", kv, 12)
    assert result["kv_scales"] == "1.0 (no scales in the checkpoint)"
    assert 0.0 <= result["greedy_agreement"] <= 1.0
    assert 0.0 < result["mean_kl"] <= result["max_kl"] < 1.0  # the fp8 cache changes the distribution, a little


@pytest.mark.parametrize(
    "argv, where",
    [
        (["--num-tokens", "0"], "argument --num-tokens: 0 not allowed"),
        (["--dtype", "float64"], "argument --dtype: invalid choice"),
        (["--attention-backend", "bogus"], "attention_backend 'bogus' not allowed"),
        (["--num-tokens", "100000"], "argument --num-tokens: 100000 not allowed (allowed: at most "),
    ],
)
def test_bad_arguments_are_one_line(argv, where, tiny_model_dir, capsys):
    """One line naming the value (exit 2), not a traceback; the token count is checked against the KV blocks."""
    from attnserve.benchmarks.kv_cache_agreement import main

    base = ["--model", tiny_model_dir("llama"), "--device", "cpu", "--dtype", "float32"]
    with pytest.raises(SystemExit) as e:
        main([*base, *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()  # argparse's usage, then the one error line
    assert err[0].startswith("usage: ") and "Traceback" not in "\n".join(err)
    assert err[-1].startswith("python -m attnserve.benchmarks.kv_cache_agreement: error: " + where)
