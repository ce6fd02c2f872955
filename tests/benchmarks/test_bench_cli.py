"""``attnserve bench throughput | latency | attention`` on CPU with a tiny random Llama: JSON fields with
exact counts, lengths within the range ratio and reproducible with --seed, the transformers baseline with a
ratio, the roofline in every row, PNG plots, and one-line errors with exit status 2."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
import torch

from attnserve.benchmarks.attention import AttentionBenchShape, AttentionRow, usable_backends
from attnserve.benchmarks.attention_table import format_table, significant
from attnserve.benchmarks.requests import length_bounds, random_requests
from attnserve.entrypoints.cli.main import main
from attnserve.refusals.bench import simulated_device
from tests.helpers import Refuses, assert_cli_refusal
from attnserve.platforms import detect_platform

SMALL_ENGINE = ["--num-gpu-blocks", "64", "--device", "cpu", "--no-progress"]


HAVE_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def _plot(path) -> list[str]:
    """``--plot PATH`` where matplotlib is installed (the ``bench`` extra), else nothing."""
    return ["--plot", str(path)] if HAVE_MATPLOTLIB else []


def _png(path) -> bool:
    if not HAVE_MATPLOTLIB:
        return True
    return path.exists() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _check_roofline(row: dict) -> None:
    r = row["roofline"]
    assert r["limit_s"] > 0 and r["measured_s"] > 0 and r["copy_bandwidth_GBps"] > 0
    assert r["pct_of_limit"] == pytest.approx(100 * r["limit_s"] / r["measured_s"])


def test_throughput_counts_lengths_baseline_and_plot(tmp_path, tiny_model_dir):
    out, png = tmp_path / "tp.json", tmp_path / "tp.png"
    rc = main(
        [
            "bench",
            "throughput",
            "--model",
            tiny_model_dir("llama"),
            "--num-prompts",
            "6",
            "--input-len",
            "20",
            "--output-len",
            "8",
            "--range-ratio",
            "0.5",
            "--seed",
            "3",
            "--max-num-seqs",
            "4",
            *SMALL_ENGINE,
            "--baseline",
            "transformers",
            "--output-json",
            str(out),
            *_plot(png),
        ]
    )
    assert rc == 0
    data = json.loads(out.read_text())
    w = data["workload"]
    assert w["num_prompts"] == 6 and len(w["input_lens"]) == len(w["output_lens"]) == 6
    lo_in, hi_in = length_bounds(20, 0.5)
    lo_out, hi_out = length_bounds(8, 0.5)
    assert (lo_in, hi_in, lo_out, hi_out) == (10, 30, 4, 12)
    assert all(lo_in <= n <= hi_in for n in w["input_lens"]) and all(lo_out <= n <= hi_out for n in w["output_lens"])
    # the same seed draws the same requests as the library function does
    expected = random_requests(6, 20, 8, 0.5, 49152, 3)
    assert w["input_lens"] == [r.input_len for r in expected] and w["output_lens"] == [r.output_len for r in expected]
    assert w["total_output_tokens"] == sum(w["output_lens"])
    assert w["total_input_tokens"] == sum(w["input_lens"])
    ours, theirs = data["results"]
    assert (ours["name"], theirs["name"], data["baseline"]) == ("attnserve", "transformers", "transformers")
    for row in (ours, theirs):
        assert row["num_requests"] == 6
        assert row["total_output_tokens"] == sum(w["output_lens"])
        assert row["total_tokens"] == sum(w["output_lens"]) + sum(w["input_lens"])
        assert row["output_tokens_per_s"] == pytest.approx(row["total_output_tokens"] / row["elapsed_s"])
        assert row["timeline"][-1][1] == row["total_output_tokens"]
        _check_roofline(row)
    # transformers: two static batches (4 + 2 requests), each running its longest output length
    lens = w["output_lens"]
    assert theirs["num_steps"] == max(lens[:4]) + max(lens[4:])
    assert data["ratio_vs_baseline"] == pytest.approx(ours["output_tokens_per_s"] / theirs["output_tokens_per_s"])
    assert data["engine"]["attention_backend"] == "CPU_ATTN" and data["engine"]["device"] == "cpu"
    assert data["engine"]["kv_cache_dtype"] == data["engine"]["dtype"] == "float32"
    assert _png(png)


def test_throughput_prompts_file_cycles_to_num_prompts(tmp_path, tiny_model_dir, capsys):
    prompts = tmp_path / "p.txt"
    prompts.write_text('hello there\n\n{"prompt": "the sky is"}\n')
    out = tmp_path / "tp.json"
    rc = main(
        [
            "bench",
            "throughput",
            "--model",
            tiny_model_dir("llama"),
            "--prompts-file",
            str(prompts),
            "--num-prompts",
            "5",
            "--output-len",
            "3",
            *SMALL_ENGINE,
            "--output-json",
            str(out),
        ]
    )
    assert rc == 0
    data = json.loads(out.read_text())
    w = data["workload"]
    assert w["num_prompts"] == 5 and w["output_lens"] == [3] * 5 and w["total_output_tokens"] == 15
    assert w["input_len"] is None  # the file sets the prompts
    a, b = w["input_lens"][:2]
    assert w["input_lens"] == [a, b, a, b, a]
    assert data["results"][0]["total_output_tokens"] == 15 and data["ratio_vs_baseline"] is None
    assert "attnserve" in capsys.readouterr().out  # the table


def test_random_requests_reproducible_with_seed():
    a = random_requests(20, 50, 30, 0.4, 1000, seed=7)
    assert a == random_requests(20, 50, 30, 0.4, 1000, seed=7)
    assert a != random_requests(20, 50, 30, 0.4, 1000, seed=8)
    assert all(30 <= r.input_len <= 70 and 18 <= r.output_len <= 42 for r in a)
    assert all(0 <= t < 1000 for r in a for t in r.prompt_token_ids)
    assert {r.input_len for r in random_requests(5, 50, 30, 0.0, 1000, seed=1)} == {50}


def test_latency_rows_percentiles_baseline_and_plot(tmp_path, tiny_model_dir):
    # 16 output tokens: the baseline's TPOT is (E2E - TTFT) / 15 from two generate calls, which a loaded
    # machine's jitter must not turn negative
    out, png = tmp_path / "lat.json", tmp_path / "lat.png"
    rc = main(
        [
            "bench",
            "latency",
            "--model",
            tiny_model_dir("llama"),
            "--batch-size",
            "1",
            "3",
            "--input-len",
            "8",
            "--output-len",
            "16",
            "--num-iters",
            "2",
            "--num-iters-warmup",
            "1",
            *SMALL_ENGINE,
            "--baseline",
            "transformers",
            "--output-json",
            str(out),
            *_plot(png),
        ]
    )
    assert rc == 0
    data = json.loads(out.read_text())
    assert [(r["name"], r["batch_size"]) for r in data["results"]] == [
        ("attnserve", 1),
        ("attnserve", 3),
        ("transformers", 1),
        ("transformers", 3),
    ]
    for r in data["results"]:
        assert (r["input_len"], r["output_len"], r["num_iters"]) == (8, 16, 2)
        for key in ("ttft_s", "tpot_s", "e2e_s", "batch_latency_s", "batch_tpot_s"):
            s = r[key]
            assert 0 < s["min"] <= s["p50"] <= s["p90"] <= s["p99"] <= s["max"]
        assert r["e2e_s"]["p50"] >= r["ttft_s"]["p50"]
        if r["name"] == "transformers":  # a static batch's TPOT is the batch's
            assert r["batch_tpot_s"] == r["tpot_s"]
        assert r["output_tokens_per_s"] == pytest.approx(r["batch_size"] * 16 * 2 / (2 * r["batch_latency_s"]["mean"]))
        _check_roofline(r)
        assert r["roofline"]["measured_s"] == r["tpot_s"]["mean"]
        # mean decode step: weights + batch x (input + output / 2) cached tokens
        roof = data["roofline"]
        assert (
            r["roofline"]["step_bytes"]
            == roof["weight_bytes"] + r["batch_size"] * (8 + 16 / 2) * roof["kv_bytes_per_token"]
        )
    assert set(data["ratio_vs_baseline"]) == {"1", "3"} and all(v > 0 for v in data["ratio_vs_baseline"].values())
    assert _png(png)


def test_attention_empty_length_list_skips_that_phase(tmp_path):
    """``--prefill-lens`` given with no value: decode cases only (a backend's prefill kernel is not built)."""
    out = tmp_path / "attn.json"
    argv = ["bench", "attention", "--device", "cpu", "--num-heads", "4", "--num-kv-heads", "2", "--head-size", "16"]
    argv += ["--block-size", "4", "--batch-size", "2", "--context-lens", "16", "--prefill-lens", "--backends"]
    argv += ["CPU_ATTN", "--warmup", "1", "--repeats", "1", "--no-progress", "--output-json", str(out)]
    assert main(argv) == 0
    data = json.loads(out.read_text())
    assert data["prefill_lens"] == []
    assert [(r["phase"], r["context_len"], r["status"]) for r in data["results"]] == [("decode", 16, "ok")]


def test_attention_config_reaches_the_backend_and_bad_ones_are_refused(tmp_path, capsys):
    """``-ac JSON`` is the engine's attention config for the timed backends' builders and Impls (recorded in the
    JSON); an unknown field, text that is not JSON and ``backend`` (``--backends`` picks) exit 2."""
    out = tmp_path / "attn.json"
    argv = ["bench", "attention", "--device", "cpu", "--num-heads", "4", "--num-kv-heads", "2", "--head-size", "16"]
    argv += ["--block-size", "4", "--batch-size", "2", "--context-lens", "16", "--prefill-lens", "--backends"]
    argv += ["FLEX_ATTENTION", "--warmup", "1", "--repeats", "1", "--no-progress"]
    assert main([*argv, "-ac", '{"use_prefill_decode_attention": true}', "--output-json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["attention_config"]["use_prefill_decode_attention"] is True
    assert [(r["backend"], r["status"]) for r in data["results"]] == [("FLEX_ATTENTION", "ok")]
    # an option FLEX_ATTENTION does not read, an unknown field, not JSON, the backend; and CPU_ATTN, whose
    # selector refuses use_prefill_decode_attention (it would change nothing there)
    cpu = [*argv[:-6], "CPU_ATTN", *argv[-5:]]
    for args, bad in (
        (argv, '{"flash_attn_version": 3}'),
        (argv, '{"flash_attn_versionx": 3}'),
        (argv, "{x"),
        (argv, '{"backend": "CPU_ATTN"}'),
        (cpu, '{"use_prefill_decode_attention": true}'),
    ):
        with pytest.raises(SystemExit) as e:
            main([*args, "-ac", bad])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert "attention" in err
        if args is cpu:  # refused for CPU_ATTN itself, the one backend asked for
            assert "no backend of CPU_ATTN can run" in err and "use_prefill_decode_attention" in err


def test_attention_backends_rows_and_plot(tmp_path, capsys):
    out, png = tmp_path / "attn.json", tmp_path / "attn.png"
    rc = main(
        [
            "bench",
            "attention",
            "--device",
            "cpu",
            "--num-heads",
            "4",
            "--num-kv-heads",
            "2",
            "--head-size",
            "16",
            "--block-size",
            "4",
            "--batch-size",
            "2",
            "--context-lens",
            "16",
            "40",
            "--prefill-lens",
            "24",
            "--warmup",
            "1",
            "--repeats",
            "3",
            "--no-progress",
            "--output-json",
            str(out),
            *_plot(png),
        ]
    )
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["backends"] == ["CPU_ATTN", "FLEX_ATTENTION"] and data["skipped"] == {}
    rows = [(r["backend"], r["phase"], r["batch_size"], r["context_len"], r["status"]) for r in data["results"]]
    assert rows == [
        ("CPU_ATTN", "decode", 2, 16, "ok"),
        ("CPU_ATTN", "decode", 2, 40, "ok"),
        ("CPU_ATTN", "prefill", 1, 24, "ok"),
        ("FLEX_ATTENTION", "decode", 2, 16, "ok"),
        ("FLEX_ATTENTION", "decode", 2, 40, "ok"),
        ("FLEX_ATTENTION", "prefill", 1, 24, "ok"),
    ]
    for r in data["results"]:
        s = r["time_us"] * 1e-6
        if r["phase"] == "decode":
            assert r["kv_TBps"] == pytest.approx(2 * 2 * r["context_len"] * 2 * 16 * 4 / s / 1e12)
        else:
            assert r["kv_TBps"] is None
            assert r["tflops"] == pytest.approx(4 * 24 * 24 * 4 * 16 / 2 / s / 1e12)
    assert _png(png)
    # the printed table: one line per row, its figures the JSON's to 3 significant digits in the header's unit
    header, *lines = capsys.readouterr().out.strip().splitlines()
    unit = {"T": 1, "G": 1e3, "M": 1e6}
    kv_unit, fl_unit = header.split()[6][0], header.split()[7][0]
    assert header.split()[5:] == ["KV", f"{kv_unit}B/s", f"{fl_unit}FLOP/s", "status"]
    assert len(lines) == len(data["results"])
    for line, r in zip(lines, data["results"]):
        cells = line.split()
        if r["phase"] == "decode":
            assert float(cells[4]) == pytest.approx(r["kv_TBps"] * unit[kv_unit], rel=5e-3)
        assert float(cells[-2]) == pytest.approx(r["tflops"] * unit[fl_unit], rel=5e-3)


def test_attention_table_cells_exact():
    # a CPU's figures: 0.0042 TB/s is 4.20 GB/s, not the 0.004 (or 0.000) of a fixed 3 decimals in TB/s
    rows = [
        AttentionRow("CPU_ATTN", "decode", 8, 1024, "ok", 2000.0, 0.0042, 0.0000336),
        AttentionRow("CPU_ATTN", "prefill", 1, 1024, "ok", 12345.67, None, 0.0123),
        AttentionRow("FLEX_ATTENTION", "decode", 8, 1024, "not implemented"),
    ]
    assert format_table(rows).splitlines() == [
        "backend         phase           shape    time us   KV GB/s   GFLOP/s  status",
        "CPU_ATTN        decode         8x1024     2000.0      4.20    0.0336  ok",
        "CPU_ATTN        prefill        L=1024    12345.7                12.3  ok",
        "FLEX_ATTENTION  decode         8x1024                                 not implemented",
    ]
    # a GPU's: the column stays in T, and a small figure beside a large one keeps 3 significant digits
    rows = [
        AttentionRow("FLASH_ATTN", "decode", 64, 8192, "ok", 1021.5, 3.5178, 1.42),
        AttentionRow("FLASH_ATTN", "decode", 1, 512, "ok", 9.87, 0.0042, 0.0000336),
    ]
    assert format_table(rows).splitlines() == [
        "backend         phase           shape    time us   KV TB/s   TFLOP/s  status",
        "FLASH_ATTN      decode        64x8192     1021.5      3.52      1.42  ok",
        "FLASH_ATTN      decode          1x512        9.9   0.00420 0.0000336  ok",
    ]
    # no figures at all (every row failed): the JSON's units
    assert format_table([AttentionRow("X", "decode", 1, 1, "error: boom")]).splitlines()[0].split()[5:8] == [
        "KV",
        "TB/s",
        "TFLOP/s",
    ]


@pytest.mark.parametrize(
    "x, cell",
    [
        (0.0042, "0.00420"),
        (3.14159, "3.14"),
        (12.345, "12.3"),
        (1234.5, "1234"),
        (0.0009996, "0.00100"),
        (0.99951, "1.00"),
        (4.2e-7, "0.000000420"),
        (0.0, "0"),
    ],
)
def test_significant_digits(x, cell):
    assert significant(x) == cell


def test_attention_backends_auto_is_the_priority_list():
    # "auto" among --backends names stands for the platform's priority list (the unknown-name message lists it)
    shape = AttentionBenchShape(4, 2, 16, 4, torch.float32)
    cpu = detect_platform("cpu")
    assert (
        list(usable_backends(shape, cpu, ["auto"]))
        == list(usable_backends(shape, cpu))
        == ["CPU_ATTN", "FLEX_ATTENTION"]
    )
    assert list(usable_backends(shape, cpu, ["FLEX_ATTENTION", "auto"])) == ["FLEX_ATTENTION", "CPU_ATTN"]


def test_attention_whose_named_backends_cannot_run_is_a_bad_value(capsys):
    """``--backends X`` that cannot run here: exit 2 and one line with every reason, as generate's
    ``--attention-backend X`` (nothing on stdout)."""
    with pytest.raises(SystemExit) as e:
        main(
            [
                "bench",
                "attention",
                "--device",
                "cpu",
                "--backends",
                "FLASH_ATTN",
                "--batch-size",
                "2",
                "--context-lens",
                "16",
                "--prefill-lens",
                "16",
                "--no-progress",
            ]
        )
    out, err = capsys.readouterr()
    assert e.value.code == 2 and out == ""
    assert err.startswith(
        f"attnserve bench attention: error: argument --backends: no backend of FLASH_ATTN can run on "
        f"{detect_platform('cpu').description}: FLASH_ATTN: device cpu not supported (supported: cuda); "
    )
    assert err.endswith("dtype float32 not supported with flash_attn_version 3 (supported: float16, bfloat16)\n")
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["throughput", "--num-prompts", "0"],
            Refuses("argument --num-prompts", 0, "integer >= 1"),
        ),
        (
            ["throughput", "--range-ratio", "1.5"],
            Refuses("argument --range-ratio", 1.5, "number in [0, 1)"),
        ),
        (
            ["throughput", "--output-len", "x"],
            Refuses("argument --output-len", "x", "integer >= 1"),
        ),
        (
            ["throughput", "--baseline", "sglang"],
            Refuses("argument --baseline", "sglang", "transformers, vllm"),
        ),
        (
            ["latency", "--batch-size", "0"],
            Refuses("argument --batch-size", 0, "integer >= 1"),
        ),
        (
            ["latency", "--num-iters-warmup", "-1"],
            Refuses("argument --num-iters-warmup", -1, "integer >= 0"),
        ),
        (
            ["attention", "--repeats", "0"],
            Refuses("argument --repeats", 0, "integer >= 1"),
        ),
        (
            ["attention", "--num-heads", "6", "--num-kv-heads", "4"],
            Refuses("argument --num-heads", 6, reason="is not a multiple of --num-kv-heads 4"),
        ),
        (
            ["attention", "--device", "cuda:9.0"],
            Refuses("device 'cuda:9.0'", "cuda:9.0", path=("device",), reason=simulated_device("cuda:9.0").reason),
        ),
        (
            ["serve", "--num-prompts", "0"],
            Refuses("argument --num-prompts", 0, "integer >= 1"),
        ),
        (
            ["serve", "--request-rate", "0"],
            Refuses("argument --request-rate", 0.0, "number > 0, or inf"),
        ),
        (
            ["serve", "--request-rate", "-2"],
            Refuses("argument --request-rate", -2.0, "number > 0, or inf"),
        ),
        (
            ["serve", "--request-rate", "nan"],
            Refuses("argument --request-rate", float("nan"), "number > 0, or inf"),
        ),
        (
            ["serve", "--max-concurrency", "0"],
            Refuses("argument --max-concurrency", 0, "integer >= 1"),
        ),
        (
            ["serve", "--input-len", "0"],
            Refuses("argument --input-len", 0, "integer >= 1"),
        ),
        (
            ["serve", "--output-len", "-1"],
            Refuses("argument --output-len", -1, "integer >= 1"),
        ),
        (["serve", "--dataset", "file"], Refuses("argument --dataset", reason="file needs --prompt-file")),
    ],
)
def test_bad_flags_exit_2_with_one_line(argv, message, capsys, worded):
    with pytest.raises(SystemExit) as e:
        main(["bench", *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    if isinstance(message, str) and message.endswith("(choose from "):  # quoting differs by Python version
        assert err.startswith(message) and err.count("\n") == 1
    else:
        assert_cli_refusal(err, f"attnserve bench {argv[0]}", message, worded)


@pytest.mark.parametrize(
    "kind, lens, longest, flags",
    [
        ("latency", ["--input-len", "10", "--output-len", "10"], 10, "--input-len/--output-len"),
        (  # a prefix lengthens every prompt: the hint names --prefix-len too (a fresh user's finding)
            "throughput",
            ["--input-len", "2", "--prefix-len", "8", "--output-len", "10", "--num-prompts", "2"],
            10,
            "--input-len/--prefix-len/--output-len/--range-ratio",
        ),
    ],
)
def test_requests_longer_than_max_model_len_exit_2(kind, lens, longest, flags, tiny_model_dir, capsys, worded):
    with pytest.raises(SystemExit) as e:
        main(["bench", kind, "--model", tiny_model_dir("llama"), "--max-model-len", "16", *lens, *SMALL_ENGINE])
    assert e.value.code == 2
    assert_cli_refusal(
        capsys.readouterr().err,
        f"attnserve bench {kind}",
        Refuses(
            f"the longest prompt ({longest} tokens) plus the longest output (10 tokens) exceeds max_model_len 16",
            advice=f"lower {flags} or raise --max-model-len",
        ),
        worded,
    )


@pytest.mark.parametrize("kind", ["latency", "throughput"])
def test_prompts_the_kv_cache_cannot_hold_are_one_line(kind, tiny_model_dir):
    """A KV cache of 2 blocks (32 tokens) and 40-token prompts: the process's stderr is one error line naming
    --num-gpu-blocks, without the engine's KV-cache warning before it (the warning waits for the prompts' check).
    A process of its own: the warning is a log record, which pytest's log capture would take in-process."""
    lens = ["--input-len", "40", "--output-len", "4"] + (
        ["--num-prompts", "2"] if kind == "throughput" else ["--batch-size", "1", "--num-iters", "1"]
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "attnserve",
            "bench",
            kind,
            "--model",
            tiny_model_dir("llama"),
            *lens,
            "--num-gpu-blocks",
            "2",
            "--device",
            "cpu",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"attnserve bench {kind}: error: argument --num-gpu-blocks: prompt of 40 tokens needs 3 KV blocks (41 tokens "
        "with the one it generates), the KV cache has 2 (32 tokens), so at most 31 prompt tokens fit; raise "
        "--num-gpu-blocks"
    )


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_bench_serve_without_a_server_says_so_in_one_line(capsys):
    port = _free_port()
    with pytest.raises(SystemExit) as e:
        main(["bench", "serve", "--port", str(port), "--num-prompts", "1"])
    assert e.value.code == (
        f"attnserve bench serve: error: GET http://127.0.0.1:{port}/v1/models failed "
        "(ConnectError: All connection attempts failed); is the server running there? "
        "(--host, --port, --base-url)"
    )


@pytest.mark.parametrize("flag", ["--prompt-file", "--prompts-file"])  # the second: bench throughput's spelling
def test_bench_serve_missing_prompt_file_exits_2_with_one_line(tmp_path, capsys, flag):
    missing = tmp_path / "none.txt"
    with pytest.raises(SystemExit) as e:
        main(
            [
                "bench",
                "serve",
                "--port",
                str(_free_port()),
                "--model",
                "m",
                "--dataset",
                "file",
                flag,
                str(missing),
            ]
        )
    assert e.value.code == 2
    assert capsys.readouterr().err.strip() == (
        f"attnserve bench serve: error: argument --prompt-file: {missing}: No such file or directory"
    )


def test_shared_prefix_and_multi_turn_requests():
    plain = random_requests(3, 10, 4, 0.0, 1000, 5)
    shared = random_requests(3, 10, 4, 0.0, 1000, 5, prefix_len=16)
    prefix = shared[0].prompt_token_ids[:16]
    assert all(r.prompt_token_ids[:16] == prefix and r.input_len == 26 for r in shared)
    assert [r.prompt_token_ids[16:] for r in shared] == [r.prompt_token_ids for r in plain]  # same own tokens
    conv = random_requests(2, 10, 4, 0.0, 1000, 5, num_turns=3)[0]
    assert conv.num_turns == 3 and conv.last_turn_lens == (10 + 2 * 10 + 2 * 4, 4)
    assert conv.turn_lens == [(10, 4), (10 + 4 + 10, 4), (10 + 2 * 4 + 2 * 10, 4)]
    second = conv.next_turn([1, 2, 3, 4])
    assert second.prompt_token_ids == conv.prompt_token_ids + [1, 2, 3, 4] + conv.next_turns[0][0]
    assert second.next_turn([5, 6, 7, 8]).next_turn([9]) is None


def test_throughput_compares_prefix_caching_on_the_same_requests(tmp_path, tiny_model_dir, capsys):
    out = tmp_path / "tp.json"
    rc = main(
        [
            "bench",
            "throughput",
            "--model",
            tiny_model_dir("llama"),
            "--num-prompts",
            "4",
            "--input-len",
            "6",
            "--output-len",
            "3",
            "--prefix-len",
            "40",
            "--num-turns",
            "2",
            "--block-size",
            "4",
            "--compare-prefix-caching",
            *SMALL_ENGINE,
            "--output-json",
            str(out),
        ]
    )
    assert rc == 0
    data = json.loads(out.read_text())
    on, off = data["results"]
    assert (on["name"], on["prefix_caching"], off["name"], off["prefix_caching"]) == (
        "attnserve",
        True,
        "attnserve (no prefix caching)",
        False,
    )
    assert on["num_requests"] == off["num_requests"] == 8 and on["total_output_tokens"] == 8 * 3
    # 4 first turns of 46 tokens (the shared 40: 10 blocks), then 4 second turns of 46 + 3 + 6 tokens
    assert on["total_tokens"] == off["total_tokens"] == 4 * 46 + 4 * 55 + 8 * 3
    workload = data["workload"]  # every request run, a conversation's two turns in order
    assert (workload["input_lens"], workload["output_lens"]) == ([46, 55] * 4, [3] * 8)
    assert workload["total_input_tokens"] == sum(workload["input_lens"])
    assert off["num_cached_tokens"] == 0 and off["prefix_cache_hit_rate"] == 0.0
    # first turns: 3 of 4 find the prefix (40); second turns: the first turn computed 48 of their 55 tokens
    assert on["num_cached_tokens"] == 3 * 40 + 4 * 48
    assert on["prefix_cache_hit_rate"] == pytest.approx(on["num_cached_tokens"] / (4 * 46 + 4 * 55))
    assert data["prefix_caching_ratio"]["output_tokens_per_s"] == pytest.approx(
        on["output_tokens_per_s"] / off["output_tokens_per_s"]
    )
    assert "prefix caching on / off" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--prompts-file", "x.txt", "--prefix-len", "8"], "argument --prefix-len: 8 not allowed with --prompts-file"),
        (["--prompts-file", "x.txt", "--input-len", "50"], "argument --input-len: 50 not allowed with --prompts-file"),
        (["--num-turns", "2", "--baseline", "transformers"], "argument --num-turns: 2 not allowed with --baseline"),
    ],
)
def test_throughput_workload_flags_that_would_be_ignored_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "throughput", "--load-format", "dummy", *argv, *SMALL_ENGINE])
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_latency_penalty_beside_a_baseline_is_refused(tiny_model_dir, capsys):
    """The baselines run without penalties: a penalty beside one would make the ratio compare unlike work."""
    argv = ["bench", "latency", "--model", tiny_model_dir("llama"), "--repetition-penalty", "1.2"]
    with pytest.raises(SystemExit) as e:
        main([*argv, "--baseline", "transformers", *SMALL_ENGINE])
    assert e.value.code == 2
    assert "argument --repetition-penalty: 1.2 not allowed with --baseline transformers" in capsys.readouterr().err


def test_attention_config_field_no_timed_backend_reads_is_a_refusal_record(capsys):
    from attnserve.benchmarks.attention import run_attention
    from attnserve.config import AttentionConfig
    from attnserve.refusals import Refused

    with pytest.raises(Refused) as e:
        run_attention(
            device="cpu",
            num_heads=4,
            num_kv_heads=2,
            head_size=16,
            block_size=4,
            context_lens=[16],
            prefill_lens=[],
            backends=["CPU_ATTN"],
            progress=False,
            attention_config=AttentionConfig(flash_attn_version=3),
        )
    r = e.value.refusal
    assert (r.path, r.value, r.reason) == (
        ("attention_config",),
        "flash_attn_version",
        "applies to none of the backends timed (CPU_ATTN)",
    )
    argv = ["bench", "attention", "--device", "cpu", "--num-heads", "4", "--num-kv-heads", "2", "--head-size", "16"]
    argv += ["--block-size", "4", "--context-lens", "16", "--prefill-lens", "--backends", "CPU_ATTN", "--no-progress"]
    with pytest.raises(SystemExit):
        main([*argv, "-ac", '{"flash_attn_version": 3}'])
    assert "argument --attention-config: 'flash_attn_version' applies to none" in capsys.readouterr().err


def test_latency_table_prints_a_dash_where_a_row_has_no_value():
    """At --output-len 1 there is no decode step: the TPOT columns and % of limit print "-" (their JSON is null),
    not nan (found by a fresh-user trial)."""
    from attnserve.benchmarks.latency import _row
    from attnserve.benchmarks.latency import format_table as latency_table
    from attnserve.benchmarks.roofline import Roofline

    roof = Roofline(copy_bandwidth=1e10, weight_bytes=10**6, kv_bytes_per_token=1024)
    row = _row("attnserve", 2, 8, 1, [0.010, 0.012], [], [0.011, 0.013], [0.013, 0.013], roof)
    assert row.tpot_s["p50"] is None and row.roofline.pct_of_limit is None
    line = latency_table([row]).splitlines()[1]
    assert line.split() == ["attnserve", "2", "11.00", "-", "-", "-", "0.012", f"{row.output_tokens_per_s:.1f}", "-"]


def test_latency_batch_larger_than_max_num_seqs_is_refused(tiny_model_dir, capsys, worded):
    """A batch the engine cannot run at once would queue, and its row would time the queue under a batch size that
    never ran (found by a fresh-user trial: --batch-size 600 with --max-num-seqs 4 printed a "batch 600" row)."""
    argv = ["bench", "latency", "--model", tiny_model_dir("llama"), "--batch-size", "2", "6", "--max-num-seqs", "4"]
    with pytest.raises(SystemExit) as e:
        main([*argv, *SMALL_ENGINE])
    assert e.value.code == 2
    assert_cli_refusal(
        capsys.readouterr().err,
        "attnserve bench latency",
        Refuses("argument --batch-size", value=6, allowed="at most 4, or raise --max-num-seqs"),
        worded,
    )
