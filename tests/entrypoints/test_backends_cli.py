"""``attnserve backends``: table, --json, explicit choice exit codes, --model folders, planning flags, and
the engine flags it shares with generate/serve/config (``-ac.FIELD``, ``--config FILE``, ...)."""

from __future__ import annotations

import json

import pytest

from attnserve.attention.validation import package_installed
from attnserve.entrypoints.cli import backends
from attnserve.entrypoints.cli.main import COMMANDS
from attnserve.entrypoints.cli.main import main as attnserve_main


def run_json(capsys, *argv) -> tuple[int, dict]:
    rc = backends.main([*argv, "--json"])
    return rc, json.loads(capsys.readouterr().out)


def test_registered_as_subcommand():
    assert COMMANDS["backends"][0] == "attnserve.entrypoints.cli.backends"


def test_planning_for_hopper_names_triton_attn_first(capsys):
    rc, report = run_json(capsys, "--device", "cuda:9.0", "--assume-installed")
    assert rc == 0
    assert report["selected"] == "TRITON_ATTN" and report["flash_attn_version"] is None
    assert report["platform"]["compute_capability"] == "9.0"
    assert report["selector_config"]["head_size"] == 64 and report["selector_config"]["dtype"] == "bfloat16"
    assert report["priority"] == ["TRITON_ATTN", "FLASH_ATTN", "FLASHINFER", "FLEX_ATTENTION"]
    assert set(report["backends"]) >= set(report["priority"]) | {"CPU_ATTN"}
    assert report["backends"]["FLASH_ATTN"] == {"usable": True, "reasons": [], "in_priority": True}


def test_without_assume_installed_names_what_this_machine_can_run(capsys):
    rc, report = run_json(capsys, "--device", "cuda:9.0")
    assert rc == 0
    usable = [n for n in report["priority"] if report["backends"][n]["usable"]]
    assert report["selected"] == (usable[0] if usable else None)
    if not any(package_installed(p) for p in ("flash_attn", "flash_attn_interface", "flash_attn.cute")):
        assert report["selected"] != "FLASH_ATTN"
        assert report["backends"]["FLASH_ATTN"]["reasons"][0].startswith("not installed: pip install 'attnserve[fa3]'")


def test_blackwell_plan_uses_flashinfer_in_the_default_layout(capsys):
    """FlashInfer's TRT-LLM kernels (which want HND) are not wired: unset, Blackwell runs its own kernels in NHD."""
    _, report = run_json(capsys, "--device", "cuda:10.0", "--assume-installed", "--head-size", "128")
    assert (report["selected"], report["kv_cache_layout"]) == ("FLASHINFER", "NHD")
    assert report["priority"][0] == "FLASHINFER"


@pytest.mark.parametrize("kv, dtype", [("auto", "bfloat16"), ("fp8", "float8_e4m3fn"), ("fp8_e5m2", "float8_e5m2")])
def test_report_shows_the_cache_dtype_and_where_its_scales_come_from(kv, dtype, capsys):
    _, report = run_json(
        capsys, "--device", "cuda:9.0", "--assume-installed", "--head-size", "128", "--kv-cache-dtype", kv
    )
    scales = "none (cache in the model dtype)" if kv == "auto" else "1.0 (no scales in the checkpoint)"
    assert report["kv_cache"] == {"kv_cache_dtype": kv, "dtype": dtype, "scales": scales}
    assert (
        backends.main(
            [
                "--device",
                "cuda:9.0",
                "--assume-installed",
                "--head-size",
                "128",
                "--kv-cache-dtype",
                kv,
                *(["--calculate-kv-scales"] if kv != "auto" else []),
            ]
        )
        == 0
    )
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("KV cache:"))
    scales = (
        "none (cache in the model dtype)" if kv == "auto" else "calculated from the first prefill (calculate_kv_scales)"
    )
    assert line == f"KV cache: {dtype} (kv_cache_dtype {kv}), fp8 scales {scales}"


def test_report_reads_a_checkpoints_kv_scales(tmp_path, capsys):
    from safetensors.torch import save_file
    import torch

    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "hidden_size": 256,
                "num_attention_heads": 2,
                "num_key_value_heads": 1,
                "num_hidden_layers": 1,
                "intermediate_size": 64,
                "vocab_size": 100,
            }
        )
    )
    save_file({"model.layers.0.self_attn.k_scale": torch.tensor(0.5)}, str(tmp_path / "model.safetensors"))
    _, report = run_json(capsys, str(tmp_path), "--device", "cuda:9.0", "--assume-installed", "--kv-cache-dtype", "fp8")
    assert report["kv_cache"]["scales"] == "from the checkpoint (k_scale/v_scale)"


def test_explicit_valid_exits_0(capsys):
    rc, report = run_json(capsys, "--device", "cuda:9.0", "--assume-installed", "--attention-backend", "triton_attn")
    assert rc == 0 and report["explicit"] == report["selected"] == "TRITON_ATTN"


def test_explicit_invalid_exits_2_with_reasons(capsys):
    rc = backends.main(
        ["--device", "cuda:8.0", "--assume-installed", "--attention-backend", "FLASHINFER", "--head-size", "80"]
    )
    out, err = capsys.readouterr()
    assert rc == 2  # as generate exits for the same backend
    assert "FLASHINFER" in out and "head_size 80 not supported (supported: 64, 128, 256)" in out
    assert "Explicit choice: FLASHINFER ✗ cannot run" in out
    assert err == (
        "attnserve backends: error: argument --attention-backend: FLASHINFER cannot run this model (head_size 80, dtype "
        "bfloat16, kv_cache_dtype auto, block_size 16) on simulated CUDA device (compute capability 8.0): "
        "head_size 80 not supported (supported: 64, 128, 256). Backends that would work: TRITON_ATTN, "
        "FLEX_ATTENTION.\n"
    )


def test_explicit_invalid_json_has_null_selected(capsys):
    rc = backends.main(
        [
            "--device",
            "cuda:9.0",
            "--assume-installed",
            "--attention-backend",
            "flash_attn",
            "--block-size",
            "8",
            "--json",
        ]
    )
    out, err = capsys.readouterr()
    report = json.loads(out)  # the whole report, then the same error line as without --json
    assert rc == 2 and report["selected"] is None
    assert "block_size 8 not supported with flash_attn_version 3 (multiples of 16)" in report["error"]
    # the flag names the setting: the line leaves the report's "attention backend" out
    assert report["error"].startswith("attention backend FLASH_ATTN cannot run this model")
    reasons = report["error"].removeprefix("attention backend ")
    assert err == f"attnserve backends: error: argument --attention-backend: {reasons}\n"


def test_automatic_selection_that_finds_none_is_a_report_not_an_error(capsys):
    """Exit 0, no line on stderr: ``backends`` answers which backends can run (here none; the table says why); the
    commands that would run the model exit 2 for the same flags (test_cli_errors)."""
    argv = [
        "--device",
        "cpu",
        "--block-size",
        "16",
        "-ac.use_prefill_decode_attention",
        "true",
        "--kv-cache-dtype",
        "fp8",
    ]
    rc = backends.main(argv)
    out, err = capsys.readouterr()
    assert rc == 0 and err == ""
    assert "Automatic selection: none (no backend can run this model here)" in out
    rc, report = run_json(capsys, *argv)
    assert rc == 0 and report["selected"] is None
    assert "CPU_ATTN: use_prefill_decode_attention not supported" in report["error"]
    assert "FLEX_ATTENTION: kv_cache_dtype fp8 not supported (supported: auto)" in report["error"]


def test_plain_table(capsys):
    assert backends.main(["--device", "cuda:7.0", "--assume-installed"]) == 0
    out = capsys.readouterr().out
    assert "TRITON_ATTN     3     ✓" in out
    assert "compute capability 7.0 not supported (needs >= 8.0)" in out
    assert "Priority order: FLASH_ATTN > FLASHINFER > TRITON_ATTN > FLEX_ATTENTION" in out
    assert "Automatic selection: TRITON_ATTN" in out


def test_flags_feed_the_selector_config(capsys):
    _, report = run_json(
        capsys,
        "--device",
        "cuda:9.0",
        "--assume-installed",
        "--head-size",
        "96",
        "--num-heads",
        "12",
        "--num-kv-heads",
        "4",
        "--dtype",
        "float32",
        "--block-size",
        "32",
        "--kv-cache-dtype",
        "fp8",
        "--sliding-window",
        "4096",
    )
    assert report["selector_config"] == {
        "head_size": 96,
        "dtype": "float32",
        "kv_cache_dtype": "fp8",
        "block_size": 32,
        "sliding_window": 4096,
        "logits_soft_cap": None,
        "has_sink": False,
        "attn_type": "decoder",
    }
    assert report["model"]["num_heads"] == 12 and report["selected"] == "TRITON_ATTN"


def test_flash_attn_version_flag(capsys):
    rc, report = run_json(
        capsys,
        "--device",
        "cuda:9.0",
        "--assume-installed",
        "-ac.flash_attn_version",
        "2",
        "--attention-backend",
        "FLASH_ATTN",
    )
    assert rc == 2
    assert report["backends"]["FLASH_ATTN"]["reasons"] == [
        "block_size 16 not supported with flash_attn_version 2 (multiples of 256)"
    ]


def test_model_folder_reads_config_only(tmp_path, capsys):
    from transformers import LlamaConfig

    LlamaConfig(
        hidden_size=640,
        num_attention_heads=8,
        num_key_value_heads=2,
        intermediate_size=64,
        num_hidden_layers=1,
        torch_dtype="float16",
    ).save_pretrained(tmp_path)
    _, report = run_json(capsys, "--model", str(tmp_path), "--device", "cuda:9.0", "--assume-installed")
    assert report["selector_config"]["head_size"] == 80 and report["selector_config"]["dtype"] == "float16"
    assert (report["model"]["num_heads"], report["model"]["num_kv_heads"]) == (8, 2)
    assert report["backends"]["FLASHINFER"]["reasons"] == ["head_size 80 not supported (supported: 64, 128, 256)"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--device", "tpu"], "argument --device: 'tpu' not allowed"),
        (["--attention-backend", "FLASH_ATTENTION"], "did you mean 'FLASH_ATTN'"),
        (["--model", "/no/such/folder"], "model '/no/such/folder' not found"),
        (["--dtype", "int8"], "argument --dtype: 'int8' not allowed (allowed: auto, float32,"),
        (["--dtype", "float64"], "argument --dtype: 'float64' not allowed (allowed: auto, float32,"),
        (
            ["--attention-backend", "FLASH_ATTN", "-ac.backend", "FLASHINFER"],
            "argument -ac.backend: 'FLASHINFER' conflicts with --attention-backend 'FLASH_ATTN'",
        ),
        # settings the default model bounds, judged as generate judges them (its 9 query heads over 3 KV heads)
        (["--device", "cpu", "--max-model-len", "100000"], "argument --max-model-len: 100000 not allowed"),
        (["--device", "cpu", "--tensor-parallel-size", "4"], "argument --tensor-parallel-size: 4 cannot split 9"),
    ],
)
def test_bad_values_exit_2_with_one_line(argv, message, capsys):
    assert backends.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_shared_attention_flag_on_cpu(capsys):
    """Through the attnserve command: -ac.backend is the shared flag; --dtype auto on CPU is float32."""
    rc = attnserve_main(["backends", "-ac.backend", "CPU_ATTN", "--device", "cpu", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 0 and report["explicit"] == report["selected"] == "CPU_ATTN"
    assert report["selector_config"]["dtype"] == "float32" and report["platform"]["device_type"] == "cpu"


def test_config_file_feeds_the_plan(tmp_path, capsys):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("block_size: 8\nattention_config:\n  backend: FLASH_ATTN\n")
    rc, report = run_json(capsys, "--config", str(cfg), "--device", "cuda:9.0", "--assume-installed")
    assert rc == 2 and report["explicit"] == "FLASH_ATTN" and report["selector_config"]["block_size"] == 8
    assert "block_size 8 not supported with flash_attn_version 3 (multiples of 16)" in report["error"]


GEMMA2 = "benchmarks/shapes/gemma-2-9b"
# each compute capability's refused backends for the Gemma-2-9B shape (head size 256, logits soft cap 50, bfloat16,
# block size 16), the same in both layer groups, and the one automatic selection picks
GEMMA2_PLANS = {
    "7.5": ({"FLASH_ATTN": ["compute capability 7.5 not supported (needs >= 8.0)"]}, "FLASHINFER"),
    "8.0": ({"FLASH_ATTN": ["block_size 16 not supported with flash_attn_version 2 (multiples of 256)"]}, "FLASHINFER"),
    "8.6": ({"FLASH_ATTN": ["block_size 16 not supported with flash_attn_version 2 (multiples of 256)"]}, "FLASHINFER"),
    "9.0": ({}, "TRITON_ATTN"),
    "10.0": (
        {"FLASH_ATTN": ["head_size 256 not supported with flash_attn_version 4 (multiples of 8 up to 128)"]},
        "FLASHINFER",
    ),
}


@pytest.mark.parametrize("cc", GEMMA2_PLANS)
def test_gemma2_shape_has_two_layer_groups_with_reasons(cc, capsys):
    rc, report = run_json(capsys, "--model", GEMMA2, "--device", f"cuda:{cc}", "--assume-installed")
    refused, selected = GEMMA2_PLANS[cc]
    assert rc == 0 and report["selected"] == selected
    assert [g["name"] for g in report["groups"]] == [
        "layer group 0 (layers 0, 2, ..., 40: head_size 256, sliding_window 4096, logits_soft_cap 50.0)",
        "layer group 1 (layers 1, 3, ..., 41: head_size 256, logits_soft_cap 50.0)",
    ]
    for group, window in zip(report["groups"], (4096, None)):
        assert group["layers"] == list(range(0 if window else 1, 42, 2))
        assert (group["selector_config"]["sliding_window"], group["selector_config"]["logits_soft_cap"]) == (
            window,
            50.0,
        )
        assert group["selector_config"]["dtype"] == "bfloat16"
        assert {n: e["reasons"] for n, e in group["backends"].items() if not e["usable"]} == {
            **refused,
            "CPU_ATTN": ["device cuda not supported (supported: cpu)"],
        }
        assert group["selected"] == selected


def test_gemma2_groups_in_the_table(capsys):
    assert backends.main(["--model", GEMMA2, "--device", "cuda:7.5", "--assume-installed"]) == 0
    out = capsys.readouterr().out
    assert "Layer group 1 (layers 1, 3, ..., 41: head_size 256, logits_soft_cap 50.0): FLASHINFER" in out
    assert out.count("FLASH_ATTN      1     ✗ compute capability 7.5 not supported (needs >= 8.0)") == 2


def test_explicit_backend_refused_names_the_first_group(capsys):
    """An explicit backend that no layer group can use (an fp8 KV cache on FLASH_ATTN 2): exit 2, the error
    naming the first group and the backends that would serve it."""
    rc = backends.main(
        [
            "--model",
            GEMMA2,
            "--device",
            "cuda:8.0",
            "--assume-installed",
            "--attention-backend",
            "FLASH_ATTN",
            "--kv-cache-dtype",
            "fp8",
            "--block-size",
            "256",
            "--json",
        ]
    )
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert rc == 2 and report["selected"] is None
    assert [g["selected"] for g in report["groups"]] == [None, None]
    assert err.startswith(
        "attnserve backends: error: argument --attention-backend: FLASH_ATTN cannot run layer "
        "group 0 (layers 0, 2, ..., 40: head_size 256, sliding_window 4096, logits_soft_cap 50.0) "
        "of this model ("
    )
    assert err.endswith(
        "kv_cache_dtype fp8 not supported with flash_attn_version 2 (supported: auto). Backends that "
        "would work: TRITON_ATTN.\n"
    )


GPT_OSS = "benchmarks/shapes/gpt-oss-20b"
_FA2_GPT_OSS = [
    "block_size 16 not supported with flash_attn_version 2 (multiples of 256)",
    "attention sinks not supported with flash_attn_version 2",
]
# each compute capability's refused backends for the gpt-oss-20b shape (head size 64, a sink per head, bfloat16,
# block size 16), the same in both layer groups, the one automatic selection picks and its FlashAttention version
# (Hopper and Blackwell: 4, the version whose kernel takes the sinks)
GPT_OSS_PLANS = {
    "7.5": ({"FLASH_ATTN": ["compute capability 7.5 not supported (needs >= 8.0)"]}, "TRITON_ATTN", None),
    "8.0": ({"FLASH_ATTN": _FA2_GPT_OSS}, "TRITON_ATTN", None),
    "8.6": ({"FLASH_ATTN": _FA2_GPT_OSS}, "TRITON_ATTN", None),
    "9.0": ({}, "TRITON_ATTN", None),
    "10.0": ({}, "FLASH_ATTN", 4),
}


@pytest.mark.parametrize("cc", GPT_OSS_PLANS)
def test_gpt_oss_shape_names_each_refused_backends_reasons(cc, capsys):
    rc, report = run_json(capsys, "--model", GPT_OSS, "--device", f"cuda:{cc}", "--assume-installed")
    refused, selected, fa_version = GPT_OSS_PLANS[cc]
    assert rc == 0 and report["selected"] == selected and report["flash_attn_version"] == fa_version
    assert [g["name"] for g in report["groups"]] == [
        "layer group 0 (layers 0, 2, ..., 22: head_size 64, sliding_window 128, attention sinks)",
        "layer group 1 (layers 1, 3, ..., 23: head_size 64, attention sinks)",
    ]
    for group, window in zip(report["groups"], (128, None)):
        assert group["layers"] == list(range(0 if window else 1, 24, 2))
        config = group["selector_config"]
        assert (config["head_size"], config["sliding_window"], config["has_sink"], config["dtype"]) == (
            64,
            window,
            True,
            "bfloat16",
        )
        assert {n: e["reasons"] for n, e in group["backends"].items() if not e["usable"]} == {
            **refused,
            "FLASHINFER": ["attention sinks not supported"],
            "CPU_ATTN": ["device cuda not supported (supported: cpu)"],
        }
        assert (group["selected"], group["flash_attn_version"]) == (selected, fa_version)


def test_gpt_oss_flash_attn_3_explicitly_is_refused_for_the_sinks(capsys):
    """FlashAttention 3 on Hopper, asked for by name: its kernel takes no sinks; exit 2 naming the first group
    and the backends that would serve it."""
    rc = backends.main(
        [
            "--model",
            GPT_OSS,
            "--device",
            "cuda:9.0",
            "--assume-installed",
            "--attention-backend",
            "FLASH_ATTN",
            "-ac.flash_attn_version",
            "3",
            "--json",
        ]
    )
    out, err = capsys.readouterr()
    assert rc == 2 and json.loads(out)["selected"] is None
    assert err.startswith(
        "attnserve backends: error: argument --attention-backend: FLASH_ATTN cannot run layer "
        "group 0 (layers 0, 2, ..., 22: head_size 64, sliding_window 128, attention sinks)"
    )
    assert "attention sinks not supported with flash_attn_version 3" in err


def test_unused_options_are_noted(capsys):
    """As the engine warns at start-up: the attention_config options given that the selected backend ignores, in
    --json (a list, per group and over the groups) and in the table."""
    argv = ["--device", "cuda:9.0", "--assume-installed", "-ac.use_trtllm_attention", "false"]
    _, report = run_json(capsys, *argv)  # automatic selection: TRITON_ATTN, which has no TRT-LLM option
    assert report["selected"] == "TRITON_ATTN"
    assert report["unused_options"] == report["groups"][0]["unused_options"] == ["use_trtllm_attention"]
    _, report = run_json(capsys, *argv, "--attention-backend", "FLASHINFER")  # its own option: used
    assert report["unused_options"] == []
    _, report = run_json(capsys, "--device", "cuda:9.0", "--assume-installed")
    assert report["unused_options"] == []  # nothing given
    assert backends.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [x for x in lines if x.startswith("Unused options: ")] == [
        "Unused options: use_trtllm_attention (they do not apply to TRITON_ATTN)"
    ]


def test_flashinfer_kernels_line_says_when_the_engine_compiles_the_missing_ones():
    from attnserve.attention.backends.flashinfer_jit import ON_ENV
    from attnserve.entrypoints.cli.backends import _kernels_line

    kernels = {"compiled": ["a"], "missing": ["b", "c"]}
    lazy = _kernels_line({**kernels, "ahead": False})
    ahead = _kernels_line({**kernels, "ahead": True})
    assert "1 of 3 compiled" in lazy and "at its first step" in lazy and f"{ON_ENV}=1" in lazy and "b, c" in lazy
    assert "in the background at its first start" in ahead and "first step" not in ahead
    assert _kernels_line({"compiled": ["a"], "missing": [], "ahead": False}).endswith("1 of 1 compiled")


def test_compile_ahead_follows_its_environment_variable(monkeypatch):
    from attnserve.attention.backends import flashinfer_jit as fj

    monkeypatch.delenv(fj.ON_ENV, raising=False)
    assert fj.compile_ahead_on() == (fj.DEFAULT_ON == "1")
    for value, on in (("1", True), ("0", False)):
        monkeypatch.setenv(fj.ON_ENV, value)
        assert fj.compile_ahead_on() is on
