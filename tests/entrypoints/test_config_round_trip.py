"""What ``attnserve config`` prints is a config file that ``--config`` takes back, for every command that takes
``--config``, giving the same configuration (found by a fresh-user trial: it printed EngineConfig's nested sections,
which --config refused: ``unknown key 'cache'``)."""

from __future__ import annotations

import json

import pytest
import yaml

from attnserve.config.engine_arg_table import engine_arg_names
from attnserve.config.engine_args import engine_arg_values
from attnserve.entrypoints.cli.engine_args import engine_config_from_args
from attnserve.entrypoints.cli.main import build_parser, main

# non-default settings, each way of giving them: flags, -ac JSON and dotted fields, vLLM's names and sizes
SETTINGS = {
    "defaults": [],
    "flashinfer": [
        "--attention-backend",
        "FLASHINFER",
        "-ac.use_trtllm_attention",
        "false",
        "-ac.disable_flashinfer_prefill",
        "true",
        "--block-size",
        "32",
        "--max-model-len",
        "4096",
        "--dtype",
        "bfloat16",
        "--kv-cache-dtype",
        "fp8",
        "--device",
        "cuda:9.0",
    ],
    "flash_attn": [
        "-ac",
        '{"backend": "FLASH_ATTN", "flash_attn_version": 3}',
        "-ac.flash_attn_max_num_splits_for_cuda_graph",
        "64",
        "--dtype",
        "half",
        "--max-model-len",
        "2k",
        "--num-gpu-blocks-override",
        "1024",
        "--enforce-eager",
        "--no-enable-chunked-prefill",
        "--max-num-seqs",
        "8",
        "--seed",
        "-9223372036854775808",
        "--gpu-memory-utilization",
        "0.5",
        "--async-scheduling",
        "--use-skinny-gemm",
        "--no-enable-pdl",
        "-ac.use_prefill_decode_attention",
        "true",
    ],
    "hub_model": [
        "org/not-downloaded",
        "--attention-backend",
        "auto",
        "--kv-cache-memory-bytes",
        "8G",
        "--max-num-batched-tokens",
        "4K",
        "--device",
        "cpu",
        "--load-format",
        "dummy",
        "--tokenizer",
        "t",
        "--revision",
        "r",
        "--download-dir",
        "/d",
        "--tensor-parallel-size",
        "2",
        "--distributed-executor-backend",
        "ray",
        "--disable-custom-all-reduce",
    ],
}
# the engine commands that take --config (bench serve is a client of a running server: no engine flags)
COMMANDS = [["config"], ["generate"], ["serve"], ["bench", "throughput"], ["bench", "latency"]]


def printed(argv: list[str], capsys) -> str:
    """What ``attnserve config ARGV`` prints (exit status 0)."""
    try:
        rc = main(["config", *argv])
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    assert rc == 0, err
    return out


def resolved(command: list[str], argv: list[str]):
    """The EngineConfig ``attnserve COMMAND ARGV`` runs with (the model given as --model: generate and bench take no
    positional MODEL)."""
    return engine_config_from_args(build_parser(command[0]).parse_args([*command, *argv]))


@pytest.mark.parametrize("name", list(SETTINGS))
@pytest.mark.parametrize(
    "fmt, suffix", [("json", ".json"), ("yaml", ".yaml"), ("json", ".yaml")]
)  # JSON is YAML: a .yaml file of the printed JSON reads too
def test_printed_config_reads_back_the_same(tmp_path, capsys, name, fmt, suffix):
    flags = SETTINGS[name]
    text = printed([*flags, "--format", fmt], capsys)
    config_file = tmp_path / f"cfg{suffix}"
    config_file.write_text(text)
    # print -> file -> --config -> print: identical
    assert printed(["--config", str(config_file), "--format", fmt], capsys) == text
    expected = resolved(["config"], flags)
    assert engine_arg_values(expected) == (json.loads(text) if fmt == "json" else yaml.safe_load(text))
    for command in COMMANDS:
        assert resolved(command, ["--config", str(config_file)]) == expected, command
    if suffix == ".json":
        assert resolved(["generate"], ["--json-config", str(config_file)]) == expected


def test_yaml_is_the_flat_file_vllm_takes(capsys):
    """--format yaml: keys in the printed order, the attention fields nested, text that YAML would read as another
    type quoted (a revision of digits)."""
    text = printed(
        [
            "org/m",
            "--revision",
            "0123",
            "--block-size",
            "32",
            "--attention-backend",
            "flashinfer",
            "--device",
            "cuda:9.0",
            "--format",
            "yaml",
        ],
        capsys,
    )
    assert text.startswith("model: org/m\ntokenizer: null\nrevision: '0123'\ndownload_dir: null\ndtype: auto\n")
    assert "\nblock_size: 32\n" in text and "\ndevice: cuda:9.0\n" in text
    assert text.endswith(
        "attention_backend: FLASHINFER\nattention_config:\n  flash_attn_version: null\n"
        "  use_prefill_decode_attention: false\n  flash_attn_max_num_splits_for_cuda_graph: 32\n"
        "  use_trtllm_attention: null\n  disable_flashinfer_prefill: false\n"
        "  disable_flashinfer_q_quantization: false\n"
    )


def test_the_command_line_overrides_a_printed_config(tmp_path, capsys):
    """A printed file is a file like any other: the command line wins, the backend too with --attention-backend (the
    key it is printed as)."""
    config_file = tmp_path / "cfg.json"
    config_file.write_text(printed(SETTINGS["flashinfer"], capsys))
    cfg = json.loads(
        printed(
            [
                "--config",
                str(config_file),
                "--block-size",
                "64",
                "--attention-backend",
                "TRITON_ATTN",
                "-ac.use_trtllm_attention",
                "null",
            ],
            capsys,
        )
    )
    assert (
        cfg["block_size"],
        cfg["attention_backend"],
        cfg["attention_config"]["use_trtllm_attention"],
        cfg["kv_cache_dtype"],
    ) == (64, "TRITON_ATTN", None, "fp8")


def test_every_printed_key_is_a_file_key(capsys):
    """Each engine argument once, by our name (vLLM's other names are taken but not printed); nothing derived from the
    model, nothing --config does not take."""
    cfg = json.loads(printed([], capsys))
    aliases = {"num_gpu_blocks_override", "kv_cache_memory_bytes"}
    assert list(cfg) == [n for n in engine_arg_names() if n not in aliases]
    assert set(cfg["attention_config"]) == {
        "flash_attn_version",
        "use_prefill_decode_attention",
        "flash_attn_max_num_splits_for_cuda_graph",
        "use_trtllm_attention",
        "disable_flashinfer_prefill",
        "disable_flashinfer_q_quantization",
    }


def test_a_file_in_engineconfigs_nested_form_is_refused_naming_the_key(tmp_path, capsys):
    """EngineConfig's sections are not file keys (a key --config does not know is an error, as before)."""
    config_file = tmp_path / "cfg.yaml"
    config_file.write_text("cache:\n  block_size: 32\n")
    with pytest.raises(SystemExit) as e:
        main(["config", "--config", str(config_file)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith(
        f"attnserve config: error: unknown key 'cache' in {config_file} (allowed: model, tokenizer, "
    )
    assert err.endswith(", attention_backend, attention_config, attention_config.FIELD)\n")


def test_generate_runs_with_a_printed_config(tmp_path, tiny_model_dir, capsys):
    """The round trip end to end: generate runs with the settings of the printed file (backend, block size, dtype)."""
    model = tiny_model_dir("llama")
    capsys.readouterr()
    config_file = tmp_path / "cfg.yaml"
    config_file.write_text(
        printed(
            [
                model,
                "--device",
                "cpu",
                "--attention-backend",
                "FLEX_ATTENTION",
                "--block-size",
                "32",
                "--max-model-len",
                "128",
                "--dtype",
                "float32",
                "-ac.use_prefill_decode_attention",
                "true",
            ],
            capsys,
        )
    )
    out_json = tmp_path / "out.json"
    rc = main(
        [
            "generate",
            "--config",
            str(config_file),
            "--prompt",
            "hello",
            "--max-tokens",
            "2",
            "--ignore-eos",
            "--output-json",
            str(out_json),
        ]
    )
    assert rc == 0, capsys.readouterr().err
    stats = json.loads(out_json.read_text())["stats"]
    assert (stats["attention_backend"], stats["device"], stats["dtype"], stats["generated_tokens"]) == (
        "FLEX_ATTENTION",
        "cpu",
        "float32",
        2,
    )
