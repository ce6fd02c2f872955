"""`attnserve config`: every CLI surface of design §5/§7, vLLM's documented examples, and error paths."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnserve.attention.registry import AttentionBackendEnum
from attnserve.config import AttentionConfig, build_engine_config
from attnserve.config.engine_args import engine_arg_values
from attnserve.entrypoints.cli.main import main
from tests.helpers import Refuses, assert_cli_refusal

FA = AttentionBackendEnum.FLASH_ATTN
FI = AttentionBackendEnum.FLASHINFER
REPO = Path(__file__).resolve().parents[2]


def run(argv, capsys):
    """Run `attnserve ARGV` in-process: (exit status, stdout, stderr)."""
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def config(argv, capsys) -> dict:
    rc, out, err = run(["config", *argv], capsys)
    assert rc == 0, err
    return json.loads(out)


def attention(argv, capsys) -> dict:
    """The printed attention settings as one mapping: the backend (printed as attention_backend) and the fields."""
    cfg = config(argv, capsys)
    return {"backend": cfg["attention_backend"], **cfg["attention_config"]}


def error(argv, capsys) -> str:
    rc, out, err = run(["config", *argv], capsys)
    assert rc == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("attnserve config: error: ")
    return lines[0]


# --- vLLM's documentation examples, verbatim with our command name -------------------------------------


def test_vllm_doc_serve_model_attention_backend(capsys):
    cfg = config(["meta-llama/Llama-3.1-8B", "--attention-backend", "FLASH_ATTN"], capsys)
    assert cfg["model"] == "meta-llama/Llama-3.1-8B" and cfg["attention_backend"] == "FLASH_ATTN"


def test_vllm_doc_flash_attn_version(capsys):
    cfg = config(["--attention-config.backend", "FLASH_ATTN", "--attention-config.flash_attn_version", "4"], capsys)
    assert cfg["attention_backend"] == "FLASH_ATTN" and cfg["attention_config"]["flash_attn_version"] == 4


def test_vllm_doc_trtllm(capsys):
    cfg = config(
        ["--attention-config.backend", "FLASHINFER", "--attention-config.use_trtllm_attention", "true"], capsys
    )
    assert cfg["attention_backend"] == "FLASHINFER" and cfg["attention_config"]["use_trtllm_attention"] is True


def test_vllm_doc_json_config(tmp_path, capsys):
    p = tmp_path / "my_config.json"
    p.write_text(
        json.dumps(
            {
                "model": "meta-llama/Llama-3.1-8B",
                "attention_config": {"backend": "FLASHINFER", "use_trtllm_attention": False},
            }
        )
    )
    cfg = config(["--json-config", str(p)], capsys)
    assert cfg["model"] == "meta-llama/Llama-3.1-8B"
    assert cfg["attention_backend"] == "FLASHINFER" and cfg["attention_config"]["use_trtllm_attention"] is False


# --- attention surfaces and their merge -----------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["--attention-backend", "flashinfer"],
        ["--attention-backend=FlashInfer"],
        ["--attention_backend", "FLASHINFER"],
        ["--attention-config.backend", "FLASHINFER"],
        ["--attention-config.backend=FLASHINFER"],
        ["-ac.backend", "FLASHINFER"],
        ["-ac.backend=flashinfer"],
        ["-ac", '{"backend": "FLASHINFER"}'],
        ["--attention-config", '{"backend": "FLASHINFER"}'],
        ['--attention-config={"backend": "FLASHINFER"}'],
        ["--attention_config.backend", "FLASHINFER"],
    ],
)
def test_every_spelling_selects_the_backend(argv, capsys):
    assert config(argv, capsys)["attention_backend"] == "FLASHINFER"


@pytest.mark.parametrize("name", ["auto", "AUTO", "Auto"])
def test_auto(name, capsys):
    assert config(["--attention-backend", name], capsys)["attention_backend"] is None


def test_json_then_dotted_both_kept(capsys):
    a = attention(
        ["--attention-config", '{"backend":"FLASH_ATTN"}', "--attention-config.flash_attn_version", "3"], capsys
    )
    assert (a["backend"], a["flash_attn_version"]) == ("FLASH_ATTN", 3)


def test_dotted_then_json_both_kept(capsys):
    a = attention(["-ac.flash_attn_version", "3", "-ac", '{"backend":"FLASH_ATTN"}'], capsys)
    assert (a["backend"], a["flash_attn_version"]) == ("FLASH_ATTN", 3)


def test_later_keys_override_earlier_across_forms(capsys):
    """A field given again in the same form (a second -ac object, a dotted flag again) takes the later value; a
    field in both forms must have one value (below)."""
    a = attention(
        [
            "-ac",
            '{"backend":"FLASH_ATTN","flash_attn_version":2}',
            "--attention-config",
            '{"flash_attn_version": 3}',
            "--attention-config.flash-attn-version=3",
            "-ac",
            '{"flash_attn_version": 3, "use_prefill_decode_attention": false}',
            "-ac.use_prefill_decode_attention",
            "false",
            "-ac.use_prefill_decode_attention",
            "true",
        ],
        capsys,
    )
    assert (a["backend"], a["flash_attn_version"], a["use_prefill_decode_attention"]) == ("FLASH_ATTN", 3, True)


@pytest.mark.parametrize(
    "argv, want",
    [
        (
            ["--attention-config", '{"backend": "FLASH_ATTN"}', "--attention-config.backend=FLASHINFER"],
            Refuses(
                "argument --attention-config.backend: ",
                value="FLASHINFER",
                path=("attention_config", "backend"),
                key="attention_config.backend",
                reason="conflicts with attention_config.backend in --attention-config 'FLASH_ATTN': two spellings of "
                "one setting",
            ),
        ),
        (
            ["-ac.flash_attn_version", "3", "-ac", '{"flash_attn_version": 2}'],
            Refuses(
                "argument -ac: attention_config.flash_attn_version 2 ",
                value=2,
                key="attention_config.flash_attn_version",
                reason="conflicts with -ac.flash_attn_version 3: two spellings of one setting",
            ),
        ),
        (
            ["--num-gpu-blocks", "4", "--num-gpu-blocks-override", "900"],
            Refuses(
                "argument --num-gpu-blocks-override: ",
                value=900,
                path=("num_gpu_blocks",),
                key="num_gpu_blocks",
                reason="conflicts with --num-gpu-blocks 4: two spellings of one setting",
                advice="give it once",
            ),
        ),
        (
            ["--kv-cache-memory-bytes", "1G", "--kv-cache-memory", "2G"],
            Refuses(
                "argument --kv-cache-memory: ",
                value=2 << 30,
                key="kv_cache_memory",
                reason=f"conflicts with --kv-cache-memory-bytes {1 << 30}: two spellings of one setting",
            ),
        ),
        (  # one flag to argparse, written two ways on one command line
            ["--block-size", "16", "--block_size", "32"],
            Refuses(
                "argument --block_size: ",
                value=32,
                key="block_size",
                reason="conflicts with --block-size 16: two spellings of one setting",
            ),
        ),
    ],
)
def test_two_spellings_with_two_values_are_refused(argv, want, capsys, worded):
    rc, _, err = run(["config", *argv], capsys)
    assert rc == 2
    assert_cli_refusal(err, "attnserve config", want, worded)


def test_two_spellings_with_one_value_are_taken(capsys):
    a = attention(["-ac", '{"backend": "flash_attn"}', "--attention-config.backend", "FLASH_ATTN"], capsys)
    assert a["backend"] == "FLASH_ATTN"
    cfg = config(["--model", "org/m", "--kv-cache-memory", "1G", "--kv-cache-memory-bytes", str(1 << 30)], capsys)
    assert cfg["kv_cache_memory"] == 1 << 30


def test_dotted_values_are_json_decoded(capsys):
    a = attention(
        [
            "-ac.use_trtllm_attention",
            "null",
            "-ac.flash_attn_max_num_splits_for_cuda_graph",
            "64",
            "-ac.disable_flashinfer_prefill",
            "false",
            "-ac.backend",
            '"TRITON_ATTN"',
        ],
        capsys,
    )
    assert a["use_trtllm_attention"] is None and a["flash_attn_max_num_splits_for_cuda_graph"] == 64
    assert a["disable_flashinfer_prefill"] is False and a["backend"] == "TRITON_ATTN"


def test_same_backend_in_both_places_is_fine(capsys):
    assert (
        config(["--attention-backend", "FLASH_ATTN", "-ac.backend", "flash_attn"], capsys)["attention_backend"]
        == "FLASH_ATTN"
    )


# --- engine flags, files and precedence -----------------------------------------------------------------


def test_engine_flags(capsys):
    cfg = config(
        [
            "--model",
            "m",
            "--dtype",
            "bfloat16",
            "--block-size",
            "32",
            "--kv-cache-dtype",
            "fp8",
            "--max-model-len",
            "4096",
            "--max_num_seqs",
            "8",
            "--enforce-eager",
            "--no-enable-chunked-prefill",
            "--device",
            "cuda:1",
            "--gpu-memory-utilization",
            "0.5",
            "--num-gpu-blocks",
            "null",
        ],
        capsys,
    )
    assert list(cfg)[:8] == [
        "model",
        "tokenizer",
        "revision",
        "download_dir",
        "dtype",
        "max_model_len",
        "load_format",
        "seed",
    ]
    assert {k: cfg[k] for k in list(cfg)[:8]} == {
        "model": "m",
        "tokenizer": None,
        "revision": None,
        "download_dir": None,
        "dtype": "bfloat16",
        "max_model_len": 4096,
        "load_format": "auto",
        "seed": 0,
    }
    assert cfg["block_size"] == 32 and cfg["kv_cache_dtype"] == "fp8"
    assert cfg["max_num_seqs"] == 8 and cfg["enable_chunked_prefill"] is False
    assert cfg["enforce_eager"] is True and cfg["device"] == "cuda:1" and cfg["gpu_memory_utilization"] == 0.5


@pytest.mark.parametrize("seed", [-(2**63), -1, 2**63 - 1])
def test_seed_takes_every_64_bit_seed(seed, capsys):
    """--seed takes the range of every seed, a request's too (was [0, 2**64 - 1], negatives refused)."""
    assert config(["--model", "m", "--seed", str(seed)], capsys)["seed"] == seed


def test_disable_custom_all_reduce_flag(capsys):
    assert config([], capsys)["disable_custom_all_reduce"] is False
    assert config(["--disable-custom-all-reduce"], capsys)["disable_custom_all_reduce"] is True
    assert (
        config(["--disable-custom-all-reduce", "--no-disable-custom-all-reduce"], capsys)["disable_custom_all_reduce"]
        is False
    )


def test_config_equals_form_applies_file_and_cli_wins(tmp_path, capsys):
    p = tmp_path / "cfg.yaml"
    p.write_text("model: from-file\nblock_size: 32\ndtype: float16\n")
    cfg = config([f"--config={p}", "--block-size", "64"], capsys)
    assert (cfg["model"], cfg["block_size"], cfg["dtype"]) == ("from-file", 64, "float16")


def test_cli_before_file_still_wins(tmp_path, capsys):
    p = tmp_path / "cfg.yaml"
    p.write_text("block_size: 32\n")
    assert config(["--block-size", "64", "--config", str(p)], capsys)["block_size"] == 64


def test_file_nested_attention_and_cli_dotted_both_survive(tmp_path, capsys):
    p = tmp_path / "cfg.yaml"
    p.write_text("attention_config:\n  backend: FLASH_ATTN\n  use_prefill_decode_attention: true\n")
    a = attention(["--config", str(p), "--attention-config.flash_attn_version", "3"], capsys)
    assert (a["backend"], a["use_prefill_decode_attention"], a["flash_attn_version"]) == ("FLASH_ATTN", True, 3)


def test_cli_dotted_overrides_file_field(tmp_path, capsys):
    p = tmp_path / "cfg.yaml"
    p.write_text("attention_config:\n  backend: FLASH_ATTN\n  flash_attn_version: 2\n")
    a = attention(["--config", str(p), "-ac.flash_attn_version", "3"], capsys)
    assert (a["backend"], a["flash_attn_version"]) == ("FLASH_ATTN", 3)


def test_yaml_false_kept_from_file(tmp_path, capsys):
    p = tmp_path / "cfg.yaml"
    p.write_text("enable_chunked_prefill: false\n")
    assert config(["--config", str(p)], capsys)["enable_chunked_prefill"] is False


def test_two_files_apply_in_order(tmp_path, capsys):
    a, b = tmp_path / "a.yaml", tmp_path / "b.json"
    a.write_text("block_size: 32\nseed: 1\n")
    b.write_text('{"block_size": 64}')
    cfg = config(["--config", str(a), "--json-config", str(b)], capsys)
    assert (cfg["block_size"], cfg["seed"]) == (64, 1)


def test_every_engine_argument_settable_from_a_file(tmp_path, capsys):
    values = {
        "model": "m",
        "tokenizer": "t",
        "revision": "v1",
        "download_dir": "/d",
        "dtype": "float16",
        "max_model_len": 7,
        "load_format": "dummy",
        "seed": 5,
        "block_size": 32,
        "kv_cache_dtype": "fp8",
        "num_gpu_blocks": 9,
        "kv_cache_memory": 1000,
        "gpu_memory_utilization": 0.3,
        "max_num_batched_tokens": 99,
        "max_num_seqs": 3,
        "enable_chunked_prefill": False,
        "tensor_parallel_size": 2,
        "distributed_executor_backend": "ray",
        "disable_custom_all_reduce": True,
        "device": "cpu",
        "enforce_eager": True,
        "attention_backend": "TRITON_ATTN",
    }
    p = tmp_path / "all.json"
    p.write_text(json.dumps(values))
    cfg = config(["--json-config", str(p)], capsys)
    expected = build_engine_config(**{k: v for k, v in values.items()})
    assert cfg == engine_arg_values(expected)


def test_positional_model_and_same_model_flag(capsys):
    assert config(["m", "--model", "m"], capsys)["model"] == "m"


def test_explain_names_sources(tmp_path, capsys):
    p = tmp_path / "cfg.yaml"
    p.write_text("block_size: 32\nattention_config:\n  backend: FLASH_ATTN\n")
    rc, out, _ = run(["config", "MODEL", "--config", str(p), "-ac.flash_attn_version", "3", "--explain"], capsys)
    assert rc == 0
    rows = {line.split()[0]: line for line in out.splitlines()}
    # the names the printed config file has, as flags and file keys take them (were EngineConfig paths: cache.block_size)
    assert rows["model"].endswith("command line (MODEL)")
    assert rows["block_size"].endswith(f"file {p}")
    assert rows["attention_backend"].endswith(f"file {p}")  # set as attention_config.backend
    assert rows["attention_config.flash_attn_version"].endswith("command line (-ac.flash_attn_version)")
    assert rows["dtype"].endswith("default")
    assert rows["enable_pdl"].endswith("default")
    assert rows["enable_prefix_caching"].split()[1:] == ["true", "default"]
    assert len(rows) == 29 + len(AttentionConfig.field_names()) + 2  # + the derived (kv cache), (skinny gemm) rows
    assert rows["(kv"].split("  ")[-1] == "derived: fp8 scales none (cache in the model dtype)"
    assert rows["use_skinny_gemm"].split()[1:] == ["null", "default"]  # unset, as async_scheduling


@pytest.mark.parametrize(
    "argv, row",
    [
        (["--device", "cpu"], "false  derived: off (no CUDA)"),
        (["--device", "cpu", "--use-skinny-gemm"], "false  derived: off (no CUDA)"),
        (["--device", "cuda:9.0", "--enforce-eager"], "false  derived: off (CUDA graphs off)"),
        (["--device", "cuda:9.0", "--no-use-skinny-gemm"], "false  derived: off (use_skinny_gemm false)"),
    ],
)
def test_explain_says_whether_the_skinny_gemm_plan_runs_and_why(argv, row, capsys):
    rc, out, _ = run(["config", *argv, "--explain"], capsys)
    line = next(line for line in out.splitlines() if line.startswith("(skinny gemm)"))
    assert rc == 0 and " ".join(line.split()[2:]) == " ".join(row.split())


def test_explain_says_the_skinny_gemm_plan_runs_on_a_gpu_with_graphs_and_triton(capsys):
    from attnserve.gemv.enable import triton_installed

    rc, out, _ = run(["config", "--device", "cuda:9.0", "--explain"], capsys)
    line = next(line for line in out.splitlines() if line.startswith("(skinny gemm)"))
    want = "true derived: on (CUDA, CUDA graphs, Triton)" if triton_installed() else "false derived: off (Triton"
    assert rc == 0 and " ".join(line.split()[2:]).startswith(want)


@pytest.mark.parametrize(
    "argv, dtype, scales",
    [
        ([], '"auto (the model dtype)"', "none (cache in the model dtype)"),
        (["--dtype", "bfloat16"], '"bfloat16"', "none (cache in the model dtype)"),
        (["--kv-cache-dtype", "fp8"], '"float8_e4m3fn"', "1.0 (no scales in the checkpoint)"),
        (
            ["--kv-cache-dtype", "fp8_e5m2", "--calculate-kv-scales"],
            '"float8_e5m2"',
            "calculated from the first prefill (calculate_kv_scales)",
        ),
    ],
)
def test_explain_says_the_cache_dtype_and_where_its_scales_come_from(argv, dtype, scales, capsys):
    rc, out, _ = run(["config", *argv, "--explain"], capsys)
    assert rc == 0
    row = next(line for line in out.splitlines() if line.startswith("(kv cache)"))
    assert row.split()[2] == dtype.split()[0] and row.endswith(f"derived: fp8 scales {scales}")


def test_help_comes_from_field_docstrings(capsys):
    rc, out, _ = run(["config", "--help"], capsys)
    assert rc == 0
    flat = " ".join(out.split())
    assert "Tokens per KV-cache block" in flat
    assert "FLASHINFER only: vLLM's switch for FlashInfer's TRT" in flat and "which attnserve does not wire" in flat
    assert "--attention-config.flash_attn_version" in flat


# --- errors: exit 2, one line, the flag or key, the value, what is allowed ------------------------------


@pytest.mark.parametrize(
    "argv, parts",
    [
        (
            ["--dtype", "float64"],
            [Refuses("argument --dtype", "float64", "auto, float32, float16, bfloat16, float, half", ("dtype",))],
        ),
        (["--attention-config.flash_attn_version", "5"], ["--attention-config.flash_attn_version", "5", "2, 3, 4"]),
        (["-ac", '{"flash_attn_version": 5}'], ["-ac", "5", "2, 3, 4"]),
        (
            ["--attention-backend", "FLASH_ATTENTION"],
            ["--attention-backend", "'FLASH_ATTENTION'", "did you mean 'FLASH_ATTN'?"],
        ),
        (["-ac.backend", "nope"], ["-ac.backend", "'nope'", "FLASHINFER"]),
        (["--attention-config.bakend", "X"], ["'bakend'", "did you mean 'backend'?"]),
        (["-ac.flash_attn_verison=3"], ["'flash_attn_verison'", "did you mean 'flash_attn_version'?"]),
        (["-ac", '{"bakend": "X"}'], ["-ac", "'bakend'", "did you mean 'backend'?"]),
        (["-ac", "{bad"], ["-ac", "malformed JSON", "line 1, column 2"]),
        (["-ac", "[1]"], ["-ac", "is not an object"]),
        (["--block-size", "0"], ["--block-size", "0", "1, 2, 4, 8, 16, 32, 64, 128, 256"]),
        (["--block-size", "7"], [Refuses("argument --block-size", 7, "1, 2, 4, 8, 16, 32, 64, 128, 256")]),
        (["--block-size", "x"], ["--block-size", "'x'", "int"]),
        (["--gpu-memory-utilization", "2"], ["--gpu-memory-utilization", "2.0", "number in (0, 1]"]),
        (["--device", "tpu"], ["--device", "'tpu'", "cuda:N"]),
        (["--kv-cache-dtype", "int4"], [Refuses("argument --kv-cache-dtype", "int4", "auto, fp8, fp8_e4m3, fp8_e5m2")]),
        (["--blok-size", "16"], ["--blok-size", "did you mean '--block-size'?"]),
        (
            ["--attention-backend", "FLASHINFER", "-ac.backend", "FLASH_ATTN"],
            ["argument -ac.backend: 'FLASH_ATTN'", "--attention-backend 'FLASHINFER'"],
        ),
        (
            ["--attention-backend", "auto", "-ac", '{"backend": "FLASH_ATTN"}'],
            ["--attention-backend 'auto'", "'FLASH_ATTN'"],
        ),
        (["a", "--model", "b"], ["argument --model: 'b'", "MODEL 'a'"]),
        (["--config", "/nonexistent/cfg.yaml"], ["cannot read config file", "/nonexistent/cfg.yaml"]),
        (["--attention-config.use_trtllm_attention", "yes"], ["use_trtllm_attention", "'yes'", "true, false, null"]),
        # a JSON value as JSON writes it (was True, None)
        (
            ["-ac.flash_attn_version", "true"],
            [Refuses("argument -ac.flash_attn_version", True, "2, 3, 4, null")],
        ),
        (
            [
                "-ac.flash_attn_version",
                '"3"',
            ],  # JSON text: a string, named as one (was "'3' not allowed (allowed: 2, 3, ...")
            [Refuses("argument -ac.flash_attn_version", "3", "2, 3, 4, null")],
        ),
        (
            ["-ac", '{"use_prefill_decode_attention": null}'],
            [Refuses("argument -ac", None, "true, false", ("attention_config", "use_prefill_decode_attention"))],
        ),
    ],
)
def test_errors(argv, parts, capsys, worded):
    """Each part is in the line; a Refuses part: the line is made from a record with its fields."""
    line = error(argv, capsys)
    for part in parts:
        if isinstance(part, Refuses):
            assert_cli_refusal(line + "\n", "attnserve config", part, worded)
        else:
            assert part in line, line


@pytest.mark.parametrize(
    "argv, line",
    [
        (
            ["generate", "--enforce-eager=maybe"],
            Refuses("argument --enforce-eager", "maybe", "no value: --enforce-eager or --no-enforce-eager"),
        ),
        (
            ["generate", "--enforce_eager=true"],
            Refuses("argument --enforce-eager", "true", "no value: --enforce-eager or --no-enforce-eager"),
        ),
        (
            ["generate", "--no-enforce-eager=1"],
            Refuses("argument --no-enforce-eager", "1", "no value: --enforce-eager or --no-enforce-eager"),
        ),
        (
            ["generate", "--enforce-eager", "maybe"],
            Refuses("argument --enforce-eager", "maybe", "no value: --enforce-eager or --no-enforce-eager"),
        ),
        (
            ["generate", "--enable-chunked-prefill=false"],
            Refuses(
                "argument --enable-chunked-prefill",
                "false",
                "no value: --enable-chunked-prefill or --no-enable-chunked-prefill",
            ),
        ),
        (
            ["generate", "--ignore-eos=yes"],
            Refuses("argument --ignore-eos", "yes", "no value: --ignore-eos"),
        ),
        (
            ["generate", "--chat", "hello"],
            Refuses("argument --chat", "hello", "no value: --chat"),
        ),
        (
            ["serve", "--enforce-eager=x"],
            Refuses("argument --enforce-eager", "x", "no value: --enforce-eager or --no-enforce-eager"),
        ),
        (
            ["bench", "latency", "--enforce-eager=x"],
            Refuses("argument --enforce-eager", "x", "no value: --enforce-eager or --no-enforce-eager"),
        ),
        (
            ["generate", "--disable-custom-all-reduce=x"],
            Refuses(
                "argument --disable-custom-all-reduce",
                "x",
                "no value: --disable-custom-all-reduce or --no-disable-custom-all-reduce",
            ),
        ),
        (
            ["config", "--explain=yes"],
            Refuses("argument --explain", "yes", "no value: --explain"),
        ),
        (
            ["backends", "--json=1"],
            Refuses("argument --json", "1", "no value: --json"),
        ),
        (["--help=x"], Refuses("argument --help", "x", "no value: -h or --help")),
        (
            ["generate", "--max-tokens", "0", "extra"],
            "attnserve generate: error: unrecognized arguments: extra",
        ),  # not after a flag
        # a true/false word after a flag without a value is not the positional MODEL
        (
            ["config", "--enforce-eager", "false"],
            Refuses("argument --enforce-eager", "false", "no value: --enforce-eager or --no-enforce-eager"),
        ),
        (
            ["serve", "--enforce-eager", "false"],
            Refuses("argument --enforce-eager", "false", "no value: --enforce-eager or --no-enforce-eager"),
        ),
        (
            ["backends", "--no-enforce-eager", "On"],
            Refuses("argument --no-enforce-eager", "On", "no value: --enforce-eager or --no-enforce-eager"),
        ),
        (
            ["config", "--explain", "1"],
            Refuses("argument --explain", "1", "no value: --explain"),
        ),
        # an unknown flag after a flag without a value is that flag's mistake, not a value for the one before
        (
            ["config", "--explain", "--jsn"],
            "attnserve config: error: unrecognized arguments: --jsn",
        ),
        (
            ["bench", "throughput", "--compare-prefix-caching", "--compare-tensor-parallel-sizes", "1"],
            "attnserve bench throughput: error: unrecognized arguments: --compare-tensor-parallel-sizes 1; "
            "did you mean '--tensor-parallel-size'?",
        ),
    ],
)
def test_a_flag_that_takes_no_value_given_one(argv, line, capsys, worded):
    """Exit 2, one line: the flag as typed, the value, and the forms allowed (argparse says "ignored
    explicit argument" or "unrecognized arguments")."""
    rc, out, err = run(argv, capsys)
    assert (rc, out) == (2, "")
    prog = " ".join(["attnserve", *argv[: 2 if argv[0] == "bench" else 1 if not argv[0].startswith("-") else 0]])
    assert_cli_refusal(err, prog, line, worded)


def test_file_errors(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: m\nblock_size: [1,\n")
    assert f"{bad}:3:1: malformed YAML" in error(["--config", str(bad)], capsys)
    unknown = tmp_path / "u.json"
    unknown.write_text('{"blok_size": 16}')
    line = error(["--json-config", str(unknown)], capsys)
    assert "'blok_size'" in line and str(unknown) in line and "did you mean 'block_size'?" in line
    # the backend in a file and on the command line: two places, the command line's precedence (not a conflict)
    other_place = tmp_path / "c.yaml"
    other_place.write_text("attention_config:\n  backend: FLASH_ATTN\n")
    assert config(["--config", str(other_place), "--attention-backend", "FLASHINFER"], capsys)["attention_backend"] == (
        "FLASHINFER"
    )
    assert config(["--attention-backend", "FLASHINFER", "--config", str(other_place)], capsys)["attention_backend"] == (
        "FLASHINFER"
    )


def test_unused_option_warned(capsys, caplog):
    rc, _, _ = run(
        ["config", "--attention-backend", "FLEX_ATTENTION", "-ac.disable_flashinfer_prefill", "true"], capsys
    )
    assert rc == 0
    assert any("disable_flashinfer_prefill" in r.getMessage() and "unused" in r.getMessage() for r in caplog.records)


def test_subprocess_python_m_attnserve(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "VLLM_ATTENTION_BACKEND": "FLASHINFER"}
    ok = subprocess.run(
        [sys.executable, "-m", "attnserve", "config", "m", "--attention-backend", "FLASH_ATTN"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["attention_backend"] == "FLASH_ATTN"
    assert "VLLM_ATTENTION_BACKEND=FLASHINFER is ignored" in ok.stderr and "--attention-backend" in ok.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "attnserve", "config", "--dtype", "float64"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr  # flag error comes first
    assert bad.stderr.startswith("attnserve config: error: argument --dtype: 'float64' not allowed (allowed: ")


def test_registered_out_of_tree_backend_name_is_accepted(capsys):
    """A name added with register_backend (out of tree) is a valid --attention-backend; nothing is imported."""
    from attnserve.attention.registry import register_backend, unregister_backend

    register_backend("MY_OOT_ATTN", "my_oot_package.attention.MyBackend")  # the module does not exist
    try:
        assert config(["--attention-backend", "my-oot-attn"], capsys)["attention_backend"] == "MY_OOT_ATTN"
        assert (
            config(["-ac.backend", "MY_OOT_ATTN", "--attention-backend", "my_oot_attn"], capsys)["attention_backend"]
            == "MY_OOT_ATTN"
        )
        assert AttentionConfig(backend="my_oot_attn").backend == "MY_OOT_ATTN"
    finally:
        unregister_backend("MY_OOT_ATTN")
    assert "'MY_OOT_ATTN' not allowed (allowed: " in error(["--attention-backend", "MY_OOT_ATTN"], capsys)


def test_a_reader_that_leaves_early_gets_no_traceback():
    """`attnserve config --explain | head -1`: the closed pipe ends the command quietly."""
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "attnserve", "config", "--explain"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    proc.stdout.close()  # the reader is gone before the command writes anything
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 1
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


@pytest.mark.parametrize("command", [["attnserve"], [sys.executable, "-m", "attnserve"]])
def test_version(command):
    import shutil

    import attnserve

    if command == ["attnserve"]:
        if shutil.which("attnserve") is None:
            pytest.skip("the attnserve script is not installed")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([*command, "--version"], capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"attnserve {attnserve.__version__}\n", "")


# --- vLLM's spellings: --num-gpu-blocks-override, --kv-cache-memory-bytes, sizes with k/K suffixes ----------------


@pytest.mark.parametrize(
    "flags, key, value",
    [
        (["--num-gpu-blocks-override", "64"], "num_gpu_blocks", 64),
        (["--kv-cache-memory-bytes", "8G"], "kv_cache_memory", 8 << 30),
        (["--kv-cache-memory", "1g"], "kv_cache_memory", 10**9),
        (["--kv-cache_memory-bytes", "1000"], "kv_cache_memory", 1000),
        (["--max-model-len", "1k"], "max_model_len", 1000),  # vLLM's human_readable_int: lowercase is decimal,
        (["--max-model-len", "1K"], "max_model_len", 1024),  # uppercase binary
        (["--max-model-len", "32k"], "max_model_len", 32000),
        (["--max-model-len", "25.6k"], "max_model_len", 25600),
        (["--max-model-len", "none"], "max_model_len", None),
        (["--max-num-batched-tokens", "2K"], "max_num_batched_tokens", 2048),
    ],
)
def test_vllm_names_and_sizes(flags, key, value, capsys):
    assert config(["--model", "org/m", *flags], capsys)[key] == value  # a hub id: no model limit checked


def test_vllm_names_in_files_and_python(tmp_path, capsys):
    p = tmp_path / "vllm.yaml"
    p.write_text("num_gpu_blocks_override: 256\nkv-cache-memory-bytes: 2G\nmax_model_len: 4K\n")  # 256 x 16 = 4K tokens
    cfg = config(["--config", str(p)], capsys)
    assert (cfg["num_gpu_blocks"], cfg["kv_cache_memory"], cfg["max_model_len"]) == (256, 2 << 30, 4096)
    cache = build_engine_config(num_gpu_blocks_override=3, kv_cache_memory_bytes=5).cache
    assert (cache.num_gpu_blocks, cache.kv_cache_memory) == (3, 5)


def test_a_vllm_name_and_ours_with_one_value(capsys):
    # (two values: test_two_spellings_with_two_values_are_refused)
    assert config(["--num-gpu-blocks", "900", "--num-gpu-blocks-override", "900"], capsys)["num_gpu_blocks"] == 900
    rc, out, _ = run(["config", "--kv-cache-memory-bytes", "1G", "--explain"], capsys)
    assert rc == 0 and any(
        line.split()[:3] == ["kv_cache_memory", "1073741824", "command"] and line.endswith("(--kv-cache-memory-bytes)")
        for line in out.splitlines()
    )


def test_max_model_len_is_checked_against_a_local_model_only(tiny_model_dir, capsys):
    """As generate: the default model's (or a local model's) max_position_embeddings bounds --max-model-len; a hub
    id is not downloaded for it, and stderr says the value was not checked."""
    rc, out, err = run(["config", "--max-model-len", "8k"], capsys)
    assert (rc, json.loads(out)["max_model_len"], err) == (0, 8000, "")
    tiny = tiny_model_dir("llama")
    capsys.readouterr()  # the fixture's own output, when it made the model
    rc, out, err = run(["config", tiny, "--max-model-len", "512"], capsys)
    assert (rc, err) == (0, "")
    rc, out, err = run(["config", "org/not-downloaded", "--max-model-len", "4096"], capsys)
    assert rc == 0 and json.loads(out)["max_model_len"] == 4096
    assert err == (
        "attnserve config: note: max_model_len 4096 not checked against the model: model 'org/not-downloaded' "
        "is not a local folder or file, and config downloads nothing\n"
    )


def test_a_kv_cache_size_is_checked_against_max_model_len_as_serve_checks_it(tiny_model_dir, capsys):
    """The failing lines are in test_cli_errors.py (with serve's); here what passes, and what is only noted: a cache
    that holds max_model_len exactly, a cache beyond this machine's memory (planned for another), a cache sized by
    gpu_memory_utilization or the CPU default (no flag gives its size), a hub model (not downloaded)."""
    tiny = tiny_model_dir("llama")  # max_position_embeddings 512; a block of 16 tokens is 8192 bytes in float32
    capsys.readouterr()
    for flags in (
        ["--num-gpu-blocks", "32"],
        ["--num-gpu-blocks", "2", "--max-model-len", "32"],
        ["--kv-cache-memory", "256K"],
        ["--kv-cache-memory", "1T"],
        ["--device", "cuda:9.0", "--num-gpu-blocks", "32"],
        [],
    ):
        rc, out, err = run(["config", tiny, "--device", "cpu", *flags], capsys)
        assert (rc, err) == (0, ""), flags
    rc, out, err = run(["config", "org/not-downloaded", "--num-gpu-blocks", "2"], capsys)
    assert rc == 0 and json.loads(out)["num_gpu_blocks"] == 2
    assert err == (
        "attnserve config: note: KV cache (num_gpu_blocks 2) not checked against max_model_len: model "
        "'org/not-downloaded' is not a local folder or file, and config downloads nothing\n"
    )


def test_vllm_short_tensor_parallel_flag(capsys, worded):
    """vLLM's -tp is --tensor-parallel-size (attnserve has no pipeline or data parallelism: no -pp, -dp)."""
    assert config(["--model", "org/m", "-tp", "2"], capsys)["tensor_parallel_size"] == 2
    # one flag: given again in either form, the later wins (not two spellings of one setting)
    assert config(["--model", "org/m", "-tp", "4", "--tensor-parallel-size", "2"], capsys)["tensor_parallel_size"] == 2
    # _ and - alike: the same value twice is one setting; one spelling repeated, the later wins
    assert config(["--model", "org/m", "--block-size", "32", "--block_size", "32"], capsys)["block_size"] == 32
    assert config(["--model", "org/m", "--block_size", "8", "--block_size", "32"], capsys)["block_size"] == 32
    rc, _, err = run(["config", "-tp", "0"], capsys)
    assert rc == 2
    assert_cli_refusal(
        err,
        "attnserve config",
        Refuses("argument -tp: ", value=0, path=("tensor_parallel_size",), allowed="integer >= 1"),
        worded,
    )
    rc, _, err = run(["config", "-pp", "2"], capsys)
    assert rc == 2 and "unrecognized arguments: -pp" in err


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_format_with_explain_is_refused(fmt, capsys, worded):
    """--explain prints a table: a --format given with it would be ignored, so the pair is refused (exit 2)."""
    rc, out, err = run(["config", "--format", fmt, "--explain"], capsys)
    assert (rc, out) == (2, "")
    assert_cli_refusal(err, "attnserve config", Refuses("argument --format", value=fmt), worded)
    assert worded[-1].reason.startswith("not allowed with --explain")
    rc, out, _ = run(["config", "--explain"], capsys)  # either alone: as before
    assert rc == 0 and out.startswith("model ")
    assert config([], capsys) == config(["--format", "json"], capsys)
