"""Soak: `attnserve serve` under mixed normal, streaming, disconnecting, slow and oversized clients for N minutes.

    python benchmarks/soak.py --minutes 3 --output-json soak.json [-- SERVER FLAGS ...]

Starts the server (the default model unless flags after ``--`` say otherwise) on a free loopback port, runs one
thread per client below for ``--minutes``, then waits for the engine to go idle and reports JSON: requests
served, errors by kind, latency of the normal requests (p50, p99, max), the server's peak and final resident
memory, and the KV blocks leaked (total minus free once idle: must be 0). Clients:

- normal: a non-streamed 16-token completion (its latency is the one reported);
- streaming: a streamed 32-token chat completion, read to ``[DONE]``;
- disconnecting: a streamed completion closed after its second chunk;
- slow: a streamed n=8, logprobs=20 completion on a socket with a 4 KiB receive buffer that is never read
  (the server's write deadline must close it and abort the request);
- oversized: a 16 MiB chunked body (the body limit must answer 413);
- slow-loris: request headers one byte every second (the header deadline must close it).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def metrics(url: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=30).text):
        for s in family.samples:
            values[s.name] = values.get(s.name, 0.0) + s.value
    return values


class Soak:
    def __init__(self, url: str, model: str, deadline: float) -> None:
        self.url, self.model, self.deadline = url, model, deadline
        self.lock = threading.Lock()
        self.served: collections.Counter = collections.Counter()  # kind -> requests answered as expected
        self.errors: collections.Counter = collections.Counter()  # "kind: what" -> count
        self.normal_latencies: list[float] = []

    def ok(self, kind: str) -> None:
        with self.lock:
            self.served[kind] += 1

    def error(self, kind: str, what: str) -> None:
        with self.lock:
            self.errors[f"{kind}: {what}"] += 1

    def loop(self, kind: str, client) -> None:
        while time.monotonic() < self.deadline:
            try:
                client()
            except Exception as e:  # noqa: BLE001 - counted by kind, the soak goes on
                self.error(kind, type(e).__name__)
                time.sleep(0.5)

    # --- clients ---------------------------------------------------------------------------------
    def normal(self) -> None:
        t0 = time.monotonic()
        r = httpx.post(
            self.url + "/v1/completions",
            timeout=120,
            json={"model": self.model, "prompt": "The capital of France is", "max_tokens": 16, "ignore_eos": True},
        )
        if r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 16:
            with self.lock:
                self.normal_latencies.append(time.monotonic() - t0)
            self.ok("normal")
        else:
            self.error("normal", f"HTTP {r.status_code}")

    def streaming(self) -> None:
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": "Tell me a story."}],
            "max_tokens": 32,
            "ignore_eos": True,
            "stream": True,
        }
        with httpx.stream("POST", self.url + "/v1/chat/completions", json=body, timeout=120) as r:
            lines = [line for line in r.iter_lines() if line]
        if r.status_code == 200 and lines and lines[-1] == "data: [DONE]":
            self.ok("streaming")
        else:
            self.error("streaming", f"HTTP {r.status_code}")

    def disconnecting(self) -> None:
        body = {
            "model": self.model,
            "prompt": "Once upon a time",
            "max_tokens": 200,
            "ignore_eos": True,
            "stream": True,
        }
        with httpx.stream("POST", self.url + "/v1/completions", json=body, timeout=120) as r:
            chunks = 0
            for line in r.iter_lines():
                chunks += bool(line)
                if chunks == 2:
                    break
        self.ok("disconnecting") if r.status_code == 200 else self.error("disconnecting", f"HTTP {r.status_code}")

    def slow(self) -> None:
        body = json.dumps(
            {
                "model": self.model,
                "prompt": "Once upon a time",
                "max_tokens": 2000,
                "n": 8,
                "logprobs": 20,
                "ignore_eos": True,
                "stream": True,
            }
        ).encode()
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(self._address())
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body) + body
        )
        try:
            t0 = time.monotonic()
            while time.monotonic() - t0 < 120:  # never read; the server's write deadline must drop the connection
                time.sleep(1)
                if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):  # reset by the server
                    self.ok("slow")
                    return
            self.error("slow", "still open after 120 s")
        finally:
            sock.close()

    def oversized(self) -> None:
        def chunks():
            yield b'{"prompt": "'
            for _ in range(256):
                yield b"a" * 65536
            yield b'"}'

        r = httpx.post(
            self.url + "/v1/completions", content=chunks(), headers={"Content-Type": "application/json"}, timeout=120
        )
        if r.status_code == 413 and r.json()["error"]["code"] == "request_body_too_large":
            self.ok("oversized")
        else:
            self.error("oversized", f"HTTP {r.status_code}")
        time.sleep(1)

    def slow_loris(self) -> None:
        sock = socket.create_connection(self._address())
        try:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
            t0 = time.monotonic()
            while time.monotonic() - t0 < 120:
                time.sleep(1)
                try:
                    sock.sendall(b"X")
                except OSError:
                    self.ok("slow_loris")  # closed by the server
                    return
            self.error("slow_loris", "still open after 120 s")
        finally:
            sock.close()

    def _address(self) -> tuple[str, int]:
        host, port = self.url.removeprefix("http://").rsplit(":", 1)
        return host, int(port)


# client kind -> threads running it
KINDS = {"normal": 2, "streaming": 2, "disconnecting": 1, "slow": 1, "oversized": 1, "slow_loris": 1}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--output-json", default=None)
    parser.add_argument(
        "--clients",
        default=",".join(KINDS),
        help=f"comma-separated client kinds to run (default all: {','.join(KINDS)}); "
        "e.g. normal,streaming for a baseline without hostile clients",
    )
    parser.add_argument("server_args", nargs=argparse.REMAINDER, help="after --: flags for attnserve serve")
    args = parser.parse_args()
    server_args = [a for a in args.server_args if a != "--"]
    kinds = args.clients.split(",")
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        parser.error(f"argument --clients: {','.join(unknown)} not allowed (allowed: {', '.join(KINDS)})")

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    log = open(os.devnull, "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "attnserve", "serve", "--port", str(port), "--log-level", "warning", *server_args],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                print("the server did not start", file=sys.stderr)
                return 1
            time.sleep(0.5)
        model = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]
        start_mb = rss_mb(proc.pid)
        soak = Soak(url, model, time.monotonic() + args.minutes * 60)
        clients = [(kind, getattr(soak, kind)) for kind in kinds for _ in range(KINDS[kind])]
        threads = [threading.Thread(target=soak.loop, args=c, daemon=True) for c in clients]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        peak_mb = start_mb
        while any(t.is_alive() for t in threads):
            peak_mb = max(peak_mb, rss_mb(proc.pid))
            time.sleep(1)
        elapsed = time.monotonic() - t0
        idle_deadline = time.monotonic() + 120
        while True:
            m = metrics(url)
            if m["attnserve_num_requests_running"] == 0 and m["attnserve_num_requests_waiting"] == 0:
                break
            if time.monotonic() > idle_deadline:
                break
            time.sleep(0.5)
        lat = sorted(soak.normal_latencies)

        def pct(q: float) -> float | None:
            return round(lat[min(len(lat) - 1, int(q * len(lat)))], 3) if lat else None

        report = {
            "minutes": round(elapsed / 60, 2),
            "server_args": server_args,
            "clients": kinds,
            "requests_served": dict(soak.served),
            "requests_served_total": sum(soak.served.values()),
            "errors": dict(soak.errors),
            "normal_latency_s": {
                "p50": pct(0.5),
                "p99": pct(0.99),
                "max": round(lat[-1], 3) if lat else None,
                "count": len(lat),
            },
            "rss_mb": {
                "start": round(start_mb, 1),
                "peak": round(max(peak_mb, rss_mb(proc.pid)), 1),
                "final": round(rss_mb(proc.pid), 1),
            },
            "requests_aborted": m.get("attnserve_request_aborted_total", 0.0),
            "http_responses": {k: v for k, v in m.items() if k == "attnserve_http_requests_total"},
            "kv_blocks_total": int(m["attnserve_kv_cache_total_blocks"]),
            "kv_blocks_leaked": int(m["attnserve_kv_cache_total_blocks"] - m["attnserve_kv_cache_free_blocks"]),
        }
        text = json.dumps(report, indent=2)
        print(text)
        if args.output_json:
            Path(args.output_json).write_text(text + "\n")
        return 0 if report["kv_blocks_leaked"] == 0 else 1
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":
    sys.exit(main())
