"""RemoteServer: ``python -m attnserve serve`` as a real subprocess on a free loopback port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[3]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RemoteServer:
    """Starts the server and waits for /health. ``startup_statuses`` records what /health and a completion
    request answered while the model loaded (503s, with their bodies)."""

    def __init__(self, args: list[str], api_key: str | None = None, timeout: float = 240.0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key
        self.log = tempfile.NamedTemporaryFile("w+", prefix="attnserve-server-", suffix=".log", delete=False)
        # the log outlives stop() (tests read it after), not this object: removed when it is collected or at exit
        weakref.finalize(self, _remove_log, self.log)
        cmd = [sys.executable, "-m", "attnserve", "serve", "--port", str(self.port), *args]
        if api_key:
            cmd += ["--api-key", api_key]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.startup_statuses: list[tuple[str, int, dict | None]] = []
        self._wait(timeout)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def log_tail(self, n: int = 4000) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()[-n:]

    def _wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                r = httpx.get(f"{self.url}/health", timeout=5)
                if r.status_code == 200:
                    return
                self.startup_statuses.append(("health", r.status_code, r.json()))
                if not any(kind == "completion" for kind, _, _ in self.startup_statuses):
                    c = httpx.post(
                        f"{self.url}/v1/completions",
                        json={"prompt": "hi", "max_tokens": 1},
                        headers=self.headers,
                        timeout=5,
                    )
                    self.startup_statuses.append(("completion", c.status_code, c.json()))
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"server not healthy after {timeout} s:\n{self.log_tail()}")

    def get(self, path: str, **kw) -> httpx.Response:
        return httpx.get(self.url + path, headers=self.headers, timeout=60, **kw)

    def post(self, path: str, **kw) -> httpx.Response:
        return httpx.post(self.url + path, headers={**self.headers, **kw.pop("headers", {})}, timeout=120, **kw)

    def openai(self, **kw):
        import openai

        return openai.OpenAI(
            base_url=self.url + "/v1", api_key=self.api_key or "unused", max_retries=0, timeout=120, **kw
        )

    def async_openai(self, **kw):
        import openai

        return openai.AsyncOpenAI(
            base_url=self.url + "/v1", api_key=self.api_key or "unused", max_retries=0, timeout=120, **kw
        )

    def metrics(self) -> dict[str, float]:
        """Sample name (with labels dropped) -> value, parsed by prometheus' own parser."""
        from prometheus_client.parser import text_string_to_metric_families

        values: dict[str, float] = {}
        for family in text_string_to_metric_families(self.get("/metrics").text):
            for s in family.samples:
                values[s.name] = values.get(s.name, 0.0) + s.value
        return values

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def _remove_log(log) -> None:
    log.close()
    Path(log.name).unlink(missing_ok=True)


def assert_refused(error: dict, param: str, value: str, allowed: str | None) -> None:
    """``error``, an OpenAI-format 400's ``error`` object, refuses the field at ``param`` (its dotted path), naming
    ``value`` as the client sent it (JSON text; ``missing`` for an absent field) and what is ``allowed`` (or
    required; any advice after it): the record's path, value and allowed, whatever the words between them."""
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, None), error
    message = error["message"]
    assert message.startswith(f"{param}: {value} "), message
    said = (f"(allowed: {allowed})", f"(required: {allowed})")
    assert allowed is None or message.endswith(said) or any(f"{t}; " in message for t in said), message
