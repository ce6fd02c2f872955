"""``attnserve bench serve`` against the live server: every request completes, the JSON has the numbers."""

from __future__ import annotations

import json

from attnserve.entrypoints.cli.main import main


def test_bench_serve_random_and_file(server, tmp_path):
    out = tmp_path / "bench.json"
    argv = [
        "bench",
        "serve",
        "--base-url",
        server.url,
        "--num-prompts",
        "4",
        "--input-len",
        "8",
        "--output-len",
        "4",
        "--max-concurrency",
        "4",
        "--output-json",
        str(out),
    ]
    assert main(argv) == 0
    s = json.loads(out.read_text())
    assert s["completed"] == 4 and s["failed"] == 0
    assert s["total_output_tokens"] == 16 and s["total_input_tokens"] > 0
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        assert s[key]["p99"] >= s[key]["median"] > 0
    assert s["output_throughput"] > 0

    prompts = tmp_path / "prompts.txt"
    prompts.write_text('Hello there\n{"prompt": "Tell me a story"}\n')
    argv = [
        "bench",
        "serve",
        "--base-url",
        server.url,
        "--dataset",
        "file",
        "--prompt-file",
        str(prompts),
        "--num-prompts",
        "2",
        "--output-len",
        "3",
        "--request-rate",
        "50",
        "--seed",
        "-3",  # the arrival times' numpy generator reads a negative seed as its 64 bits, as the engine does
        "--endpoint",
        "/v1/chat/completions",
        "--output-json",
        str(out),
    ]
    assert main(argv) == 0
    s = json.loads(out.read_text())
    assert s["completed"] == 2 and s["total_output_tokens"] == 6 and s["config"]["seed"] == -3


def test_bench_serve_reports_errors(server, tmp_path):
    out = tmp_path / "bench.json"
    argv = [
        "bench",
        "serve",
        "--base-url",
        server.url,
        "--model",
        "no-such-model",
        "--num-prompts",
        "2",
        "--output-len",
        "2",
        "--output-json",
        str(out),
    ]
    assert main(argv) == 1
    s = json.loads(out.read_text())
    assert s["failed"] == 2 and "HTTP 404" in s["errors"][0]


def test_bench_serve_shared_prefix_and_conversations_report_cached_tokens(server, tmp_path):
    out = tmp_path / "bench.json"
    argv = [
        "bench",
        "serve",
        "--base-url",
        server.url,
        "--num-prompts",
        "3",
        "--input-len",
        "6",
        "--prefix-len",
        "60",
        "--num-turns",
        "2",
        "--output-len",
        "3",
        "--max-concurrency",
        "1",
        "--endpoint",
        "/v1/chat/completions",
        "--output-json",
        str(out),
    ]
    assert main(argv) == 0
    s = json.loads(out.read_text())
    assert s["completed"] == 6 and s["total_output_tokens"] == 18
    # one request at a time: every request after the first finds at least the shared prefix's full blocks
    assert s["total_cached_tokens"] >= 5 * 48
    assert s["prefix_cache_hit_rate"] == s["total_cached_tokens"] / s["total_input_tokens"]
