"""Hostile and slow clients against a real server process (a tiny random Llama with a long context, loopback):
oversized bodies, slow-loris connections, a client that stops reading its stream, too many connections, lists
over their limits. Each refusal is OpenAI's error body naming its limit; the server's memory stays within
``RSS_BOUND_MB`` of where it started; normal requests keep being answered within ``NORMAL_LATENCY_S``; the stalled
request is aborted and every KV block is free again.

Bounds, on a shared 2-core CPU: the server's resident memory grows by less than 100 MB (before the output
collector and the write deadline, one client that stopped reading a streamed n=32, logprobs=5 request cost 311 MB
and kept the engine generating for 374 s); a normal 8-token completion is answered within 10 s while the hostile
clients run (typically well under one).
"""

from __future__ import annotations

import json
import shutil
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.entrypoints.openai.utils import RemoteServer

BODY_LIMIT = 1 << 20  # --max-request-body-bytes
HEADER_S, BODY_S, WRITE_S = 2, 4, 2  # --timeout-request-header, --timeout-request-body, --timeout-write-stall
CONCURRENCY = 48  # --limit-concurrency
RSS_BOUND_MB = 100
NORMAL_LATENCY_S = 10.0
MAX_TOKENS = 7000  # a stream that runs for minutes unless aborted


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("hostile") / "tiny-llama-8k"
    shutil.copytree(tiny_model_dir("llama"), folder)
    config = json.loads((folder / "config.json").read_text())
    config["max_position_embeddings"] = MAX_TOKENS + 192
    (folder / "config.json").write_text(json.dumps(config))
    srv = RemoteServer(
        [
            str(folder),
            "--served-model-name",
            "tiny",
            "--log-level",
            "warning",
            "--max-num-seqs",
            "64",
            "--max-request-body-bytes",
            str(BODY_LIMIT),
            "--timeout-request-header",
            str(HEADER_S),
            "--timeout-request-body",
            str(BODY_S),
            "--timeout-write-stall",
            str(WRITE_S),
            "--limit-concurrency",
            str(CONCURRENCY),
        ]
    )
    yield srv
    srv.stop()


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def normal(server: RemoteServer) -> float:
    """One normal completion; its latency in seconds (asserted correct)."""
    t0 = time.monotonic()
    r = httpx.post(
        server.url + "/v1/completions",
        timeout=60,
        json={"model": "tiny", "prompt": "Hello there", "max_tokens": 8, "ignore_eos": True},
    )
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 8
    return time.monotonic() - t0


class Watch:
    """While hostile clients run: normal requests one after another, and the server's peak memory."""

    def __init__(self, server: RemoteServer) -> None:
        self.server, self.latencies, self.peak_mb = server, [], rss_mb(server.proc.pid)
        self.base_mb = self.peak_mb
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.latencies.append(normal(self.server))
            self.peak_mb = max(self.peak_mb, rss_mb(self.server.proc.pid))
            self._stop.wait(0.2)

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(120)
        assert self.latencies, "no normal request was answered"
        assert max(self.latencies) < NORMAL_LATENCY_S, self.latencies
        assert self.peak_mb - self.base_mb < RSS_BOUND_MB, (self.base_mb, self.peak_mb)


def read_response(
    sock: socket.socket, timeout: float = 30, until_closed: bool = False
) -> tuple[int, dict | None, bool]:
    """(status, JSON body or None, whether the server closed) of the response on a raw socket; ``until_closed``:
    read on after the response, to see the server close the connection."""
    sock.settimeout(timeout)
    data, closed = b"", False
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                closed = True
                break
            data += chunk
            head, sep, body = data.partition(b"\r\n\r\n")
            length = next(
                (
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ),
                None,
            )
            if sep and length is not None and len(body) >= length and not until_closed:
                break
    except ConnectionResetError:
        closed = True
    if not data:
        return 0, None, closed
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body) if body else None, closed


def assert_error(body: dict, status_type: str, code: str, *words: str) -> None:
    error = body["error"]
    assert (error["type"], error["code"]) == (status_type, code), body
    for w in words:
        assert w in error["message"], body


def wait_idle(server: RemoteServer, aborted_before: float, timeout: float = 60) -> dict:
    """Metrics once an abort was counted and nothing runs: every KV block free."""
    deadline = time.monotonic() + timeout
    while True:
        m = server.metrics()
        if (
            m.get("attnserve_request_aborted_total", 0.0) > aborted_before
            and m["attnserve_num_requests_running"] == 0
            and m["attnserve_kv_cache_free_blocks"] == m["attnserve_kv_cache_total_blocks"]
        ):
            return m
        assert time.monotonic() < deadline, (m, server.log_tail())
        time.sleep(0.2)


def test_a_client_that_stops_reading_its_stream_is_disconnected_and_its_request_aborted(server):
    aborted = server.metrics().get("attnserve_request_aborted_total", 0.0)
    body = json.dumps(
        {
            "model": "tiny",
            "prompt": "Once upon a time",
            "max_tokens": MAX_TOKENS,
            "n": 8,
            "logprobs": 20,
            "ignore_eos": True,
            "stream": True,
        }
    ).encode()
    with Watch(server):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # its window fills at once
        sock.connect(("127.0.0.1", server.port))
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body) + body
        )
        t0 = time.monotonic()
        m = wait_idle(server, aborted)  # never read: the write deadline closes it, the engine aborts it
        elapsed = time.monotonic() - t0
    assert elapsed < 60, elapsed
    sock.setblocking(False)
    closed = False
    try:
        while sock.recv(1 << 20):
            pass
        closed = True
    except ConnectionResetError:
        closed = True
    except BlockingIOError:
        pass
    sock.close()
    assert closed, "the server kept the connection of a client that does not read"
    assert m["attnserve_kv_cache_usage_perc"] == 0.0


def test_oversized_bodies_are_refused_while_read_with_413(server):
    # a Content-Length over the limit: answered before a byte of the body is read
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b'Content-Length: 200000000\r\n\r\n{"prompt": "'
    )
    status, body, _ = read_response(sock)
    sock.close()
    assert status == 413
    assert_error(
        body,
        "invalid_request_error",
        "request_body_too_large",
        "200000000 bytes",
        str(BODY_LIMIT),
        "--max-request-body-bytes",
    )

    # chunked, no Content-Length: counted as it arrives; four at once, 16 MB each
    def chunks():
        yield b'{"prompt": "'
        for _ in range(256):
            yield b"a" * 65536
        yield b'"}'

    results: list = []

    def send() -> None:
        results.append(
            httpx.post(
                server.url + "/v1/completions",
                content=chunks(),
                timeout=60,
                headers={"Content-Type": "application/json"},
            )
        )

    with Watch(server):
        threads = [threading.Thread(target=send) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    assert [r.status_code for r in results] == [413] * 4
    assert_error(
        results[0].json(),
        "invalid_request_error",
        "request_body_too_large",
        f"more than {BODY_LIMIT} bytes",
        "--max-request-body-bytes",
    )


def test_slow_loris_and_idle_connections_are_closed_at_the_header_deadline(server):
    with Watch(server):
        loris = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(20)]
        bare = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(5)]
        for s in loris:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        t0 = time.monotonic()
        open_ = set(range(len(loris)))
        while open_ and time.monotonic() - t0 < HEADER_S + 8:
            time.sleep(0.5)
            for i in list(open_):
                try:
                    loris[i].sendall(b"X")  # one byte of a header that never ends
                except OSError:
                    open_.discard(i)
        assert not open_, f"{len(open_)} slow-loris connections still open after {time.monotonic() - t0:.1f} s"
        status, body, closed = read_response(bare[0], timeout=HEADER_S + 8, until_closed=True)
        assert (status, closed) == (408, True)
        assert_error(
            body, "invalid_request_error", "timeout_request_header", f"{HEADER_S} s", "--timeout-request-header"
        )
        for s in bare[1:]:
            assert read_response(s, timeout=HEADER_S + 8, until_closed=True)[2]
    for s in loris + bare:
        s.close()


def test_a_body_that_trickles_is_closed_at_the_body_deadline(server):
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"
    )
    status, body, closed = read_response(sock, timeout=BODY_S + 10, until_closed=True)
    sock.close()
    assert (status, closed) == (408, True)
    assert_error(body, "invalid_request_error", "timeout_request_body", f"{BODY_S} s", "--timeout-request-body")


def test_connections_over_the_cap_are_answered_503(server):
    held = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(CONCURRENCY)]
    try:
        time.sleep(0.3)
        r = httpx.post(server.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 1}, timeout=30)
        assert r.status_code == 503, r.text
        assert_error(
            r.json(), "service_unavailable", "limit_concurrency", f"at most {CONCURRENCY}", "--limit-concurrency"
        )
    finally:
        for s in held:
            s.close()
    deadline = time.monotonic() + 10
    while True:  # the held connections' close reaches the server
        r = httpx.post(server.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 1}, timeout=30)
        if r.status_code == 200:
            break
        assert time.monotonic() < deadline, r.text
        time.sleep(0.2)


def test_too_many_headers_are_answered_431(server):
    headers = {f"x-h{i}": "1" for i in range(300)}
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 1}, headers=headers, timeout=30)
    assert r.status_code == 431
    assert_error(r.json(), "invalid_request_error", "h11_max_header_count", "at most 256", "--h11-max-header-count")


def test_a_header_block_over_h11s_limit_is_answered_431(server):
    limit = 4 * 1024 * 1024  # --h11-max-incomplete-event-size's default, vLLM's
    sock = socket.create_connection(("127.0.0.1", server.port))
    try:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (2 * limit) + b"\r\n\r\n")
    except OSError:  # the server answered and closed while the header was still going out
        pass
    status, body, _ = read_response(sock)
    sock.close()
    assert status == 431
    assert_error(
        body, "invalid_request_error", "h11_max_incomplete_event_size", str(limit), "--h11-max-incomplete-event-size"
    )


@pytest.mark.parametrize(
    "field, value, param, code, words",
    [
        ("stop", ["x"] * 65, "stop", "array_above_max_length", "at most 64 stop strings"),
        ("stop", ["ok", "y" * 1025], "stop.1", "string_above_max_length", "at most 1024 characters"),
        ("stop", "y" * 1025, "stop", "string_above_max_length", "at most 1024 characters"),
        ("stop_token_ids", [1] * 1025, "stop_token_ids", "array_above_max_length", "at most 1024 stop token ids"),
        ("prompt", ["a"] * 1025, "prompt", "array_above_max_length", "at most 1024 prompts"),
    ],
)
def test_lists_over_their_limits_are_refused_with_400_naming_the_limit(server, field, value, param, code, words):
    body = {"model": "tiny", "prompt": "Hi", "max_tokens": 1, field: value}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert_error(r.json(), "invalid_request_error", code, words)
    if field != "prompt":
        chat = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, field: value}
        r = httpx.post(server.url + "/v1/chat/completions", json=chat, timeout=30)
        assert (r.status_code, r.json()["error"]["param"], r.json()["error"]["code"]) == (400, param, code)
