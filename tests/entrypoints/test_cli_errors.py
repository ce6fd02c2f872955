"""Every subcommand's bad-input paths: the exit status, one line on stderr, the place it names, and the refusal record
the line is made from.

A usage error (a bad flag value, a bad combination of flags, a bad config file, an explicit attention
backend that cannot run the model here) exits 2 with one line ``PROG: error: WHERE: ...`` (argparse's form;
PROG is ``attnserve``, ``attnserve generate``, ``attnserve bench serve``, ...; WHERE the flag or file); a valid
request that cannot be carried out (no server to benchmark) exits 1 with a line of the same form. ``backends --json``
prints the same line; its stdout is then the report (JSON) or nothing. Each case names the record's fields
(``path``, ``value``, ``allowed``, ``key``: the setting blamed), not its words; the golden line of this surface is
``test_the_golden_line`` (and tests/test_refusals.py). A case whose record is None is a line worded without a
record (a prompts file, a model that is not found, the benchmarks' own checks).
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from attnserve.entrypoints.cli.main import main
from attnserve.refusals import NO_VALUE, statement

AC_FIELDS = (
    "backend, flash_attn_version, use_prefill_decode_attention, flash_attn_max_num_splits_for_cuda_graph, "
    "use_trtllm_attention, disable_flashinfer_prefill, disable_flashinfer_q_quantization"
)
BACKENDS = "FLASH_ATTN, FLASHINFER, TRITON_ATTN, FLEX_ATTENTION, CPU_ATTN, CUSTOM, auto"
HUMAN_INT = (
    "suffixes as in vLLM: k, m, g, t = 10^3, 10^6, 10^9, 10^12 (with a fraction: 1.5k); "
    "K, M, G, T = 2^10, 2^20, 2^30, 2^40 (whole numbers only)"
)

# (argv, exit status, the place the line names after "PROG: error: ", the record's fields or None)
CASES = [
    (["nosuch"], 2, "argument COMMAND", None),
    (  # a choice flag: the project's line, as a config file's value, not argparse's "invalid choice"
        ["generate", "--dtype", "fp9"],
        2,
        "argument --dtype",
        {"path": ("dtype",), "value": "fp9", "allowed": "auto, float32, float16, bfloat16, float, half"},
    ),
    (
        ["serve", "--kv-cache-dtype", "fp9"],
        2,
        "argument --kv-cache-dtype",
        {"path": ("kv_cache_dtype",), "value": "fp9", "allowed": "auto, fp8, fp8_e4m3, fp8_e5m2"},
    ),
    (
        ["bench", "attention", "--dtype", "fp9"],
        2,
        "argument --dtype",
        {"value": "fp9", "allowed": "auto, float32, float16, bfloat16"},
    ),
    (["generate", "--max-tokens", "x"], 2, "argument --max-tokens", {"value": "x", "allowed": "integer >= 1"}),
    (
        ["generate", "--max-tokens", "0"],
        2,
        "argument --max-tokens",
        {"path": ("max_tokens",), "value": 0, "allowed": "integer >= 1"},
    ),
    (
        ["generate", "--top-k", "-2"],
        2,
        "argument --top-k",
        {"path": ("top_k",), "value": -2, "allowed": "0 or -1 (all), or integer >= 1"},
    ),
    (
        ["generate", "--prompt", ""],
        2,
        "argument --prompt",
        {"path": ("prompt",), "value": "", "allowed": "a prompt of at least 1 token"},
    ),
    (["generate", "--prompts-file", "{tmp}/none.txt"], 2, "argument --prompts-file", None),
    (["generate", "--prompts-file", "{tmp}/empty.txt"], 2, "argument --prompts-file", None),
    (["generate", "--prompt", "hi", "--prompts-file", "{tmp}/blank.txt"], 2, "argument --prompts-file", None),
    (["generate", "--prompts-file", "{tmp}/latin1.txt"], 2, "argument --prompts-file", None),
    (["generate", "--model", "/no/such/dir"], 2, "model '/no/such/dir' not found", None),
    (
        ["generate", "--block-size", "0"],
        2,
        "argument --block-size",
        {"path": ("block_size",), "value": 0, "allowed": "1, 2, 4, 8, 16, 32, 64, 128, 256"},
    ),
    (
        ["generate", "--block-size", "7"],
        2,
        "argument --block-size",
        {"path": ("block_size",), "value": 7, "allowed": "1, 2, 4, 8, 16, 32, 64, 128, 256"},
    ),
    (
        ["generate", "--attention-backend", "NOPE"],
        2,
        "argument --attention-backend",
        {"path": ("attention_backend",), "value": "NOPE", "allowed": BACKENDS},
    ),
    (["generate", "-ac", "{bad"], 2, "argument -ac", {}),
    (
        ["generate", "-ac", '{"no_such": 1}'],
        2,
        "argument -ac",
        {"value": "no_such", "allowed": AC_FIELDS, "key": "attention_config.no_such"},
    ),
    (
        ["generate", "-ac.flash_attn_version", "5"],
        2,
        "argument -ac.flash_attn_version",
        {"path": ("attention_config", "flash_attn_version"), "value": 5, "allowed": "2, 3, 4, null"},
    ),
    (
        ["generate", "-ac.no_such", "1"],
        2,
        "argument -ac.no_such",
        {"value": "no_such", "allowed": AC_FIELDS, "key": "attention_config.no_such"},
    ),
    (["generate", "--config", "{tmp}/none.yaml"], 2, "cannot read config file '{tmp}/none.yaml'", {}),
    (["generate", "--config", "{tmp}/bad.yaml"], 2, "{tmp}/bad.yaml:2:1", {}),
    (
        ["generate", "--model", "{tiny}", "--device", "cpu", "--attention-backend", "TRITON_ATTN"],
        2,
        "argument --attention-backend",
        {"key": "attention_config.backend"},
    ),
    (
        ["generate", "--model", "{tiny}", "--device", "cpu", "--config", "{tmp}/triton.yaml"],
        2,
        "{tmp}/triton.yaml",
        {"key": "attention_config.backend"},
    ),
    (
        ["generate", "--attention-backend", "CPU_ATTN", "-ac.backend", "FLEX_ATTENTION"],
        2,
        "argument -ac.backend",
        {"value": "FLEX_ATTENTION", "key": "attention_backend"},
    ),
    (
        [
            "generate",
            "--model",
            "{tiny}",
            "--device",
            "cpu",
            "--no-enable-chunked-prefill",
            "--max-num-batched-tokens",
            "4",
            "--prompt",
            "one two three four five six seven",
        ],
        2,
        "argument --max-num-batched-tokens",
        {"key": "max_num_batched_tokens"},
    ),
    (
        ["generate", "--model", "{tiny}", "--device", "cpu", "--max-model-len", "100000"],
        2,
        "argument --max-model-len",
        {"path": ("max_model_len",), "value": 100000, "allowed": "at most the model's max_position_embeddings, 512"},
    ),
    (
        ["generate", "--model", "{tiny}", "--device", "cpu", "--kv-cache-memory", "10"],
        2,
        "argument --kv-cache-memory",
        {"key": "kv_cache_memory"},
    ),
    (
        ["generate", "--model", "{tiny}", "--device", "cpu", "--kv-cache-memory-bytes", "10"],
        2,
        "argument --kv-cache-memory-bytes",
        {"key": "kv_cache_memory"},
    ),
    (
        [
            "generate",
            "--model",
            "{tiny}",
            "--device",
            "cpu",
            "--num-gpu-blocks",
            "1",
            "--block-size",
            "4",
            "--prompt",
            "one two three four",
        ],
        2,
        "argument --num-gpu-blocks",
        {"key": "num_gpu_blocks"},
    ),
    (
        [
            "generate",
            "--model",
            "{tiny}",
            "--device",
            "cpu",
            "-ac.use_prefill_decode_attention",
            "true",
            "--kv-cache-dtype",
            "fp8",
        ],
        2,
        "argument -ac.use_prefill_decode_attention",
        {"key": "attention_config.use_prefill_decode_attention"},
    ),
    (
        ["generate", "--model", "{tiny}", "--device", "cpu", "--config", "{tmp}/fp8.yaml"],
        2,
        "{tmp}/fp8.yaml",
        {"key": "attention_config.use_prefill_decode_attention"},
    ),
    (
        ["generate", "--model", "{tiny}", "--device", "cpu", "--tensor-parallel-size", "3"],
        2,
        "argument --tensor-parallel-size",
        {"path": ("tensor_parallel_size",), "value": 3},
    ),
    (
        ["generate", "--model", "{tiny_gpt2}", "--device", "cpu", "--tensor-parallel-size", "2"],
        2,
        "argument --tensor-parallel-size",
        {"path": ("tensor_parallel_size",), "value": 2},
    ),
    (
        ["generate", "--config", "{tmp}/empty.yaml"],
        2,
        "{tmp}/empty.yaml",
        {"allowed": "a mapping of engine argument names to values, e.g. 'dtype: float32', or {} for no settings"},
    ),
    (
        ["generate", "--json-config", "{tmp}/empty.txt"],
        2,
        "{tmp}/empty.txt",
        {"allowed": 'a mapping of engine argument names to values, e.g. {"dtype": "float32"}, or {} for no settings'},
    ),
    (
        ["generate", "--config", "{tmp}/list.yaml"],
        2,
        "{tmp}/list.yaml",
        {"allowed": "a mapping of engine argument names to values, e.g. 'dtype: float32', or {} for no settings"},
    ),
    (
        ["generate", "--config", "{tmp}/dtype.yaml"],
        2,
        "{tmp}/dtype.yaml",
        {"path": ("dtype",), "value": "float64", "allowed": "auto, float32, float16, bfloat16, float, half"},
    ),
    (
        ["serve", "--port", "70000"],
        2,
        "argument --port",
        {"value": 70000, "allowed": "integer in [0, 65535]; 0 picks a free port"},
    ),
    (["serve", "/no/such/dir"], 2, "model '/no/such/dir' not found", None),
    (
        ["serve", "{tiny}", "--device", "cpu", "--attention-backend", "TRITON_ATTN", "--port", "0"],
        2,
        "argument --attention-backend",
        {"key": "attention_config.backend"},
    ),
    (
        ["serve", "{tiny}", "--device", "cpu", "--tensor-parallel-size", "3", "--port", "0"],
        2,
        "argument --tensor-parallel-size",
        {"path": ("tensor_parallel_size",), "value": 3},
    ),
    (
        ["serve", "{tiny}", "--device", "cpu", "--max-model-len", "100000", "--port", "0"],
        2,
        "argument --max-model-len",
        {"path": ("max_model_len",), "value": 100000, "allowed": "at most the model's max_position_embeddings, 512"},
    ),
    (
        ["serve", "{tiny}", "--device", "cpu", "--kv-cache-memory", "10", "--port", "0"],
        2,
        "argument --kv-cache-memory",
        {"key": "kv_cache_memory"},
    ),
    (
        ["serve", "{tiny}", "--device", "cpu", "--config", "{tmp}/small_kv.yaml", "--port", "0"],
        2,
        "{tmp}/small_kv.yaml",
        {"key": "kv_cache_memory"},
    ),
    (
        ["serve", "{tiny}", "--device", "cpu", "--num-gpu-blocks", "2", "--port", "0"],
        2,
        "argument --num-gpu-blocks",
        {"key": "num_gpu_blocks"},
    ),
    (
        ["serve", "{tiny}", "--device", "cpu", "--kv-cache-memory-bytes", "8K", "--port", "0"],
        2,
        "argument --kv-cache-memory-bytes",
        {"key": "kv_cache_memory"},
    ),
    (
        ["serve", "{tiny}", "--device", "cpu", "--config", "{tmp}/two_blocks.yaml", "--port", "0"],
        2,
        "{tmp}/two_blocks.yaml",
        {"key": "num_gpu_blocks"},
    ),
    (
        ["config", "{tiny}", "--device", "cpu", "--num-gpu-blocks", "2"],
        2,
        "argument --num-gpu-blocks",
        {"key": "num_gpu_blocks"},
    ),
    (
        ["config", "{tiny}", "--device", "cpu", "--kv-cache-memory-bytes", "8K"],
        2,
        "argument --kv-cache-memory-bytes",
        {"key": "kv_cache_memory"},
    ),
    (
        ["config", "{tiny}", "--device", "cpu", "--config", "{tmp}/two_blocks.yaml"],
        2,
        "{tmp}/two_blocks.yaml",
        {"key": "num_gpu_blocks"},
    ),
    (
        ["config", "{tiny}", "--device", "cpu", "--kv-cache-memory", "10"],
        2,
        "argument --kv-cache-memory",
        {"key": "kv_cache_memory"},
    ),
    (
        [
            "serve",
            "{tiny}",
            "--device",
            "cpu",
            "-ac.use_prefill_decode_attention",
            "true",
            "--kv-cache-dtype",
            "fp8",
            "--port",
            "0",
        ],
        2,
        "argument -ac.use_prefill_decode_attention",
        {"key": "attention_config.use_prefill_decode_attention"},
    ),
    (["serve", "a", "--model", "b"], 2, "argument --model", {"value": "b", "key": "model"}),
    (["serve", "--model", "b", "a"], 2, "argument MODEL", {"value": "a", "key": "model"}),
    (
        ["config", "--kv-cache-memory-bytes", "1GiB"],
        2,
        "argument --kv-cache-memory-bytes",
        {"value": "1GiB", "allowed": f"integer >= 1 (bytes), null; {HUMAN_INT}"},
    ),
    (
        ["config", "--max-model-len", "1.5K"],
        2,
        "argument --max-model-len",
        {"value": "1.5K", "allowed": f"integer >= 1, null; {HUMAN_INT}"},
    ),
    (
        ["config", "--config", "{tmp}/gib.yaml"],
        2,
        "{tmp}/gib.yaml",
        {"path": ("max_model_len",), "value": "8KiB", "allowed": f"integer >= 1, null; {HUMAN_INT}"},
    ),
    (
        ["config", "--num-gpu-blocks-override", "0"],
        2,
        "argument --num-gpu-blocks-override",
        {"path": ("num_gpu_blocks",), "value": 0, "allowed": "integer >= 1, null"},
    ),
    (
        ["config", "--max-model-len", "999999"],
        2,
        "argument --max-model-len",
        {"path": ("max_model_len",), "value": 999999, "allowed": "at most the model's max_position_embeddings, 8192"},
    ),
    (
        ["config", "{tiny}", "--max-model-len", "1M"],
        2,
        "argument --max-model-len",
        {"path": ("max_model_len",), "value": 1048576, "allowed": "at most the model's max_position_embeddings, 512"},
    ),
    (["config", "--config", "{tmp}/bad.yaml"], 2, "{tmp}/bad.yaml:2:1", {}),
    (["backends", "--model", "/no/such/dir"], 2, "argument --model", None),
    (["backends", "--head-size", "0"], 2, "argument --head-size", {"value": 0, "allowed": "integer >= 1"}),
    (
        ["backends", "--head-size", "64", "--num-heads", "0"],
        2,
        "argument --num-heads",
        {"value": 0, "allowed": "integer >= 1"},
    ),
    (
        ["backends", "--head-size", "64", "--num-kv-heads", "-1"],
        2,
        "argument --num-kv-heads",
        {"value": -1, "allowed": "integer >= 1"},
    ),
    (["backends", "--model", "/no/such/dir", "--json"], 2, "argument --model", None),
    (
        ["backends", "--model", "{tiny}", "--device", "cpu", "--attention-backend", "TRITON_ATTN"],
        2,
        "argument --attention-backend",
        {"key": "attention_config.backend"},
    ),
    (
        ["backends", "--model", "{tiny}", "--device", "cpu", "--attention-backend", "TRITON_ATTN", "--json"],
        2,
        "argument --attention-backend",
        {"key": "attention_config.backend"},
    ),
    (
        [
            "backends",
            "--device",
            "cuda:8.0",
            "--assume-installed",
            "--attention-backend",
            "FLASHINFER",
            "--head-size",
            "80",
        ],
        2,
        "argument --attention-backend",
        {"key": "attention_config.backend"},
    ),
    (["bench"], 2, "the following arguments are required: KIND", None),
    (
        ["bench", "throughput", "--model", "{tiny}", "--device", "cpu", "--prompts-file", "{tmp}/none.txt"],
        2,
        "argument --prompts-file",
        None,
    ),
    (
        ["bench", "throughput", "--model", "{tiny}", "--device", "cpu", "--prompts-file", "{tmp}/empty.txt"],
        2,
        "argument --prompts-file",
        None,
    ),
    (
        ["bench", "throughput", "--model", "{tiny}", "--device", "cpu", "--prompts-file", "{tmp}/latin1.txt"],
        2,
        "argument --prompts-file",
        None,
    ),
    (
        [
            "bench",
            "throughput",
            "--model",
            "{tiny}",
            "--device",
            "cpu",
            "--no-enable-chunked-prefill",
            "--max-num-batched-tokens",
            "4",
            "--input-len",
            "8",
            "--num-prompts",
            "1",
            "--output-len",
            "1",
            "--no-progress",
        ],
        2,
        "argument --max-num-batched-tokens",
        {"key": "max_num_batched_tokens"},
    ),
    (["bench", "throughput", "--model", "/no/such/dir"], 2, "model '/no/such/dir' not found", None),
    (["bench", "latency", "--model", "/no/such/dir"], 2, "model '/no/such/dir' not found", None),
    (
        ["bench", "latency", "--model", "{tiny}", "--device", "cpu", "--compare-tensor-parallel-sizes", "1", "3"],
        2,
        "argument --compare-tensor-parallel-sizes",
        {"path": ("tensor_parallel_size",), "value": 3},
    ),
    (
        [
            "bench",
            "throughput",
            "--model",
            "{tiny}",
            "--device",
            "cpu",
            "-ac.use_prefill_decode_attention",
            "true",
            "--kv-cache-dtype",
            "fp8",
        ],
        2,
        "argument -ac.use_prefill_decode_attention",
        {"key": "attention_config.use_prefill_decode_attention"},
    ),
    (
        ["bench", "latency", "--model", "{tiny}", "--device", "cpu", "--tensor-parallel-size", "3"],
        2,
        "argument --tensor-parallel-size",
        {"path": ("tensor_parallel_size",), "value": 3},
    ),
    (["bench", "attention", "--backends", "NOPE"], 2, "argument --backends", None),
    (["bench", "attention", "--num-heads", "6", "--num-kv-heads", "4"], 2, "argument --num-heads", None),
    (["bench", "attention", "--context-lens", "--prefill-lens"], 2, "argument --context-lens", {"value": []}),
    (["bench", "attention", "-ac.flash_attn_version", "3"], 2, "argument -ac.flash_attn_version", None),
    (  # refused before the model loads, at its flag
        ["bench", "latency", "--model", "/no/such/model", "--frequency-penalty", "5"],
        2,
        "argument --frequency-penalty",
        {"value": 5.0, "allowed": "number in [-2, 2]"},
    ),
    (
        ["bench", "attention", "--backends", "CPU_ATTN", "-ac", '{"use_prefill_decode_attention": true}'],
        2,
        "argument --backends",
        None,
    ),
    (["bench", "serve", "--dataset", "file"], 2, "argument --dataset", None),
    (
        ["bench", "serve", "--model", "m", "--prompt-file", "{tmp}/nokey.jsonl", "--input-len", "50"],
        2,
        "argument --input-len",
        {"value": 50},
    ),
    (["bench", "serve", "--port", "70000"], 2, "argument --port", {"value": 70000, "allowed": "integer in [1, 65535]"}),
    (["bench", "serve", "--base-url", "http://127.0.0.1:99999"], 2, "argument --base-url", None),
    (["bench", "serve", "--host", "::::"], 2, "argument --host", None),
    (
        ["bench", "serve", "--model", "m", "--dataset", "file", "--prompt-file", "{tmp}/none.txt"],
        2,
        "argument --prompt-file",
        None,
    ),
    (
        ["bench", "serve", "--model", "m", "--dataset", "file", "--prompt-file", "{tmp}/empty.txt"],
        2,
        "argument --prompt-file",
        None,
    ),
    (
        ["bench", "serve", "--model", "m", "--dataset", "file", "--prompt-file", "{tmp}/latin1.txt"],
        2,
        "argument --prompt-file",
        None,
    ),
    (
        ["bench", "serve", "--model", "m", "--dataset", "file", "--prompt-file", "{tmp}/nokey.jsonl"],
        2,
        "argument --prompt-file",
        None,
    ),
    (
        ["bench", "serve", "--model", "m", "--dataset", "file", "--prompt-file", "{tmp}/badjson.jsonl"],
        2,
        "argument --prompt-file",
        None,
    ),
    (["generate", "--prompts-file", "{tmp}/nokey.jsonl"], 2, "argument --prompts-file", None),
    (["bench", "serve", "--model", "m", "--prompt-file", "{tmp}/nokey.jsonl"], 2, "argument --prompt-file", None),
    (
        ["bench", "serve", "--model", "m", "--dataset", "random", "--prompt-file", "{tmp}/nokey.jsonl"],
        2,
        "argument --prompt-file",
        None,
    ),
    (
        ["bench", "throughput", "--model", "{tiny}", "--device", "cpu", "--prompts-file", "{tmp}/nokey.jsonl"],
        2,
        "argument --prompts-file",
        None,
    ),
]


@pytest.fixture
def files(tmp_path):
    (tmp_path / "bad.yaml").write_text("a: [1\n")
    (tmp_path / "dtype.yaml").write_text("dtype: float64\n")
    (tmp_path / "empty.yaml").write_text("")
    (tmp_path / "list.yaml").write_text("- dtype: float32\n")
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "blank.txt").write_text("\n  \n\t\n")
    (tmp_path / "triton.yaml").write_text("attention_backend: TRITON_ATTN\n")
    (tmp_path / "fp8.yaml").write_text("kv_cache_dtype: fp8\nattention_config:\n  use_prefill_decode_attention: true\n")
    (tmp_path / "nokey.jsonl").write_text('{"prompt": "a"}\n\n{"text": "b"}\n')
    (tmp_path / "badjson.jsonl").write_text('{"prompt": "a"}\n{"prompt": 1,}\n')
    (tmp_path / "small_kv.yaml").write_text("kv_cache_memory: 10\n")
    (tmp_path / "gib.yaml").write_text("max_model_len: 8KiB\n")
    (tmp_path / "two_blocks.yaml").write_text("num_gpu_blocks_override: 2\n")
    (tmp_path / "latin1.txt").write_bytes("first\n\ncaf\u00e9\n".encode("latin-1"))  # é is 0xe9, at offset 10
    return tmp_path


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    """``attnserve ARGV`` in this process: the exit status, stdout and stderr, as the interpreter would give them."""
    try:
        rc = main(argv)
    except SystemExit as e:
        if isinstance(e.code, str):  # the interpreter prints the message and exits 1
            out, err = capsys.readouterr()
            return 1, out, err + e.code + "\n"
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def prog_of(argv: list[str]) -> str:
    """The PROG argparse names: ``attnserve``, ``attnserve generate``, ``attnserve bench serve``."""
    if argv[0] not in ("generate", "serve", "bench", "backends", "config"):
        return "attnserve"
    return " ".join(["attnserve", *argv[: 2 if argv[0] == "bench" and len(argv) > 1 else 1]])


def assert_one_line_from_record(err: str, prog: str, where: str, record: dict | None, worded: list) -> None:
    """``err`` is one line ``PROG: error: WHERE...``; with ``record``, made from the last record worded (its
    statement, advice aside, is in the line), whose fields are ``record``'s."""
    assert err.count("\n") == 1 and err.startswith(f"{prog}: error: {where}"), err
    if record is None:
        return
    assert worded, err
    r = worded[-1]
    assert {k: getattr(r, k) for k in record} == record, r
    assert statement(dataclasses.replace(r, advice="", suggestion=None)) in err, (r, err)


@pytest.mark.parametrize("argv, status, where, record", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_bad_input_exits_with_one_line(argv, status, where, record, files, tiny_model_dir, capsys, worded):
    tiny = tiny_model_dir("llama") if "{tiny}" in argv else ""
    tiny_gpt2 = tiny_model_dir("gpt2") if "{tiny_gpt2}" in argv else ""
    fill = lambda s: (  # noqa: E731
        s.replace("{tmp}", str(files)).replace("{tiny}", tiny).replace("{tiny_gpt2}", tiny_gpt2)
    )
    capsys.readouterr()  # what making the tiny model wrote
    worded.clear()
    rc, out, err = run([fill(a) for a in argv], capsys)
    assert rc == status
    if "--json" in argv:  # stdout stays a JSON document, or is empty
        assert out == "" or json.loads(out)
    assert_one_line_from_record(err, prog_of(argv), fill(where), record, worded)


def test_the_golden_line(tiny_model_dir, capsys):
    """The one whole line of this surface: a setting found wrong once the model is known, placed at its flag."""
    capsys.readouterr()
    argv = ["generate", "--model", tiny_model_dir("llama"), "--device", "cpu", "--max-model-len", "100000"]
    assert run(argv, capsys)[0::2] == (
        2,
        "attnserve generate: error: argument --max-model-len: 100000 not allowed (allowed: at most the "
        "model's max_position_embeddings, 512)\n",
    )


@pytest.mark.parametrize("cmd", ["generate", "serve"])
def test_a_kv_cache_beyond_the_machines_memory_exits_with_one_line(cmd, tiny_model_dir, capsys, worded):
    """``--num-gpu-blocks 10**20`` (vLLM's spelling) is one line naming the flag (serve: refused before the server
    listens), keyed to the setting; before, torch's overflow traceback or the kernel's OOM kill."""
    tiny = tiny_model_dir("llama")
    capsys.readouterr()
    model = [tiny] if cmd == "serve" else ["--model", tiny, "--prompt", "hi"]
    argv = [cmd, *model, "--device", "cpu", "--num-gpu-blocks-override", str(10**20)] + (
        ["--port", "0"] if cmd == "serve" else []
    )
    worded.clear()
    rc, out, err = run(argv, capsys)
    assert rc == 2
    assert_one_line_from_record(
        err, f"attnserve {cmd}", "argument --num-gpu-blocks-override", {"key": "num_gpu_blocks"}, worded
    )
    assert worded[-1].value is NO_VALUE
