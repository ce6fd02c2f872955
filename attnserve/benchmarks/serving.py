"""Serving benchmark: an async load generator against a running OpenAI-compatible server.

Sends streamed requests at a request rate (Poisson arrivals, or all at once) and/or under a concurrency
cap, and measures per request TTFT (time to the first token), TPOT (time per output token after the
first), ITL (gaps between streamed chunks) and end-to-end latency, plus throughput and errors.
Talks plain HTTP (httpx) so that it measures any OpenAI-compatible server, attnserve's or another.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import asdict, dataclass, field

import httpx
import numpy as np

from attnserve.benchmarks.requests import PromptsFileError, numpy_rng, read_prompts_file
from attnserve.refusals import bench as bench_words
from attnserve.refusals.cli import RANDOM_PROMPTS, no_prompts

_WORDS = (
    "the of and to in is was for on that with as by at from his her an which are this be or have one "
    "had not but were all they their we been has when who will more no out if so what can said about "
    "into time some than other could only two then first new its like over these such after most"
).split()


@dataclass(frozen=True)
class BenchConfig:
    """What load to send where."""

    base_url: str = "http://127.0.0.1:8000"
    endpoint: str = "/v1/completions"  # or /v1/chat/completions
    model: str | None = None  # None = the server's first model
    num_prompts: int = 100
    request_rate: float = float("inf")  # requests per second (Poisson); inf = send all at once
    max_concurrency: int | None = None  # most requests in flight
    input_len: int = 128  # random prompts: about this many words
    output_len: int = 128  # max_tokens of each request
    prefix_len: int = 0  # random prompts: words of one prefix every prompt starts with
    num_turns: int = 1  # conversations of this many turns (each prompt opens one; turns run in order)
    prompt_file: str | None = None  # one prompt per line, or JSONL with a "prompt" field
    ignore_eos: bool = True  # generate exactly output_len tokens (attnserve/vLLM extension)
    temperature: float = 0.0
    seed: int = 0
    api_key: str | None = None
    timeout: float = 600.0


@dataclass
class RequestResult:
    """One request, as the client saw it. Times in seconds."""

    ok: bool = False
    prompt_len: int = 0  # from the server's usage, when it reports one
    cached_tokens: int = 0  # usage.prompt_tokens_details.cached_tokens, when reported
    output_tokens: int = 0
    text: str = ""  # the answer (a conversation's next turn holds it)
    ttft: float | None = None
    e2e: float = 0.0
    itl: list[float] = field(default_factory=list)
    error: str | None = None


def load_prompts(cfg: BenchConfig) -> list[str]:
    """``num_prompts`` prompts: from the file (cycled), or random words. Raises OSError and PromptsFileError for a
    file that cannot be read or used (:func:`~attnserve.benchmarks.requests.read_prompts_file`)."""
    if cfg.prompt_file:
        prompts = read_prompts_file(cfg.prompt_file)
        if not prompts:
            raise PromptsFileError(no_prompts(cfg.prompt_file, "--prompt-file", RANDOM_PROMPTS))
        return [prompts[i % len(prompts)] for i in range(cfg.num_prompts)]
    rng = random.Random(cfg.seed)
    prefix = " ".join(rng.choice(_WORDS) for _ in range(cfg.prefix_len))
    return [
        " ".join([prefix] * bool(prefix) + [rng.choice(_WORDS) for _ in range(cfg.input_len)])
        for _ in range(cfg.num_prompts)
    ]


def next_messages(cfg: BenchConfig, opening: str, turns: int) -> list[str]:
    """A conversation's later user messages (``turns`` - 1 of them), random words drawn from a generator of its
    own (seeded by the opening), so a conversation's messages do not depend on the timing of the others."""
    rng = random.Random(f"{cfg.seed} {opening}")
    return [" ".join(rng.choice(_WORDS) for _ in range(cfg.input_len)) for _ in range(turns - 1)]


async def _one(client: httpx.AsyncClient, cfg: BenchConfig, model: str, prompt: str | list[dict]) -> RequestResult:
    """One streamed request: ``prompt`` is the completion prompt, or the chat messages."""
    body = {
        "model": model,
        "max_tokens": cfg.output_len,
        "temperature": cfg.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": cfg.ignore_eos,
    }
    chat = "chat" in cfg.endpoint
    body.update({"messages": prompt} if chat else {"prompt": prompt})
    res, start = RequestResult(), time.perf_counter()
    last = start
    try:
        async with client.stream("POST", cfg.endpoint, json=body) as r:
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {(await r.aread()).decode(errors='replace')[:300]}"
                return res
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                data = json.loads(line[6:])
                if "error" in data:
                    res.error = data["error"].get("message", str(data["error"]))
                    return res
                if data.get("usage"):
                    res.prompt_len = data["usage"]["prompt_tokens"]
                    res.output_tokens = data["usage"]["completion_tokens"]
                    res.cached_tokens = (data["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0
                text = "".join(
                    (c.get("delta") or {}).get("content") or "" if chat else c.get("text") or ""
                    for c in data.get("choices") or []
                )
                res.text += text
                if text:
                    now = time.perf_counter()
                    if res.ttft is None:
                        res.ttft = now - start
                    else:
                        res.itl.append(now - last)
                    last = now
        res.e2e = time.perf_counter() - start
        res.ok = res.ttft is not None
        if not res.ok:
            res.error = "no tokens received"
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        res.error = f"{type(e).__name__}: {e}"
    return res


class BenchServerError(RuntimeError):
    """The server could not be asked for its model (not running there, wrong key): one line for the CLI."""


async def _served_model(client: httpx.AsyncClient, cfg: BenchConfig) -> str:
    """The server's first model name, from ``GET /v1/models``."""
    url = f"{cfg.base_url.rstrip('/')}/v1/models"
    try:
        r = await client.get("/v1/models")
    except httpx.HTTPError as e:
        raise BenchServerError(bench_words.server_unreachable(url, e)) from None
    body = r.text.replace("\n", " ")[:300]
    if r.status_code != 200:
        raise BenchServerError(bench_words.server_answered(url, r.status_code, body))
    try:
        return r.json()["data"][0]["id"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise BenchServerError(bench_words.no_model_listed(url, body)) from None


async def run_benchmark(cfg: BenchConfig) -> dict:
    """Send the load; return the summary (what ``--output-json`` writes).

    Raises OSError / ValueError for an unreadable prompt file (before any request) and BenchServerError
    when the server cannot name its model."""
    prompts = load_prompts(cfg)
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=cfg.base_url, headers=headers, timeout=cfg.timeout, limits=limits) as client:
        model = cfg.model or await _served_model(client, cfg)
        gate = asyncio.Semaphore(cfg.max_concurrency) if cfg.max_concurrency else None
        rng = numpy_rng(cfg.seed)

        async def limited(prompt: str | list[dict]) -> RequestResult:
            if gate is None:
                return await _one(client, cfg, model, prompt)
            async with gate:
                return await _one(client, cfg, model, prompt)

        async def conversation(opening: str) -> list[RequestResult]:
            """The turns of one conversation in order: each prompt holds the turns before it and their answers."""
            chat = "chat" in cfg.endpoint
            results, prompt = [], [{"role": "user", "content": opening}] if chat else opening
            for message in [None, *next_messages(cfg, opening, cfg.num_turns)]:
                if message is not None:
                    answer = results[-1].text
                    prompt = (
                        prompt + [{"role": "assistant", "content": answer}, {"role": "user", "content": message}]
                        if chat
                        else f"{prompt}{answer} {message}"
                    )
                results.append(await limited(prompt))
                if not results[-1].ok:
                    break
            return results

        start, tasks = time.perf_counter(), []
        for prompt in prompts:
            tasks.append(asyncio.create_task(conversation(prompt)))
            if cfg.request_rate != float("inf"):
                await asyncio.sleep(float(rng.exponential(1.0 / cfg.request_rate)))
        results = [r for turns in await asyncio.gather(*tasks) for r in turns]
        duration = time.perf_counter() - start
    return summarize(cfg, model, results, duration)


def _stats(values: list[float]) -> dict[str, float | None]:
    """Milliseconds: mean, median, p90, p99, max."""
    if not values:
        return {k: None for k in ("mean", "median", "p90", "p99", "max")}
    a = np.asarray(values) * 1000.0
    return {
        "mean": float(a.mean()),
        "median": float(np.median(a)),
        "p90": float(np.percentile(a, 90)),
        "p99": float(np.percentile(a, 99)),
        "max": float(a.max()),
    }


def summarize(cfg: BenchConfig, model: str, results: list[RequestResult], duration: float) -> dict:
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_len for r in ok)
    cached = sum(r.cached_tokens for r in ok)
    tpots = [(r.e2e - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    errors = [r.error for r in results if not r.ok]
    return {
        "config": {k: (None if v == float("inf") else v) for k, v in asdict(cfg).items() if k != "api_key"},
        "model": model,
        "duration_s": duration,
        "completed": len(ok),
        "failed": len(errors),
        "errors": sorted(set(errors))[:10],
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "total_cached_tokens": cached,  # prompt tokens the server found in its prefix cache (from usage)
        "prefix_cache_hit_rate": cached / in_tokens if in_tokens else 0.0,
        "request_throughput": len(ok) / duration if duration else 0.0,
        "output_throughput": out_tokens / duration if duration else 0.0,
        "total_token_throughput": (in_tokens + out_tokens) / duration if duration else 0.0,
        "ttft_ms": _stats([r.ttft for r in ok]),
        "tpot_ms": _stats(tpots),
        "itl_ms": _stats([x for r in ok for x in r.itl]),
        "e2e_ms": _stats([r.e2e for r in ok]),
    }


def format_summary(s: dict) -> str:
    lines = [
        f"{'Model':<32}{s['model']}",
        f"{'Successful requests':<32}{s['completed']}",
        f"{'Failed requests':<32}{s['failed']}",
        f"{'Duration (s)':<32}{s['duration_s']:.2f}",
        f"{'Input tokens':<32}{s['total_input_tokens']}",
        f"{'Cached input tokens':<32}{s['total_cached_tokens']} ({100 * s['prefix_cache_hit_rate']:.1f}%)",
        f"{'Output tokens':<32}{s['total_output_tokens']}",
        f"{'Request throughput (req/s)':<32}{s['request_throughput']:.2f}",
        f"{'Output throughput (tok/s)':<32}{s['output_throughput']:.2f}",
        f"{'Total throughput (tok/s)':<32}{s['total_token_throughput']:.2f}",
    ]
    for key, name in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2e_ms", "E2E latency")):
        st = s[key]
        if st["mean"] is not None:
            lines.append(
                f"{name + ' (ms)':<32}mean {st['mean']:.1f}  median {st['median']:.1f}  "
                f"p90 {st['p90']:.1f}  p99 {st['p99']:.1f}"
            )
    lines += [f"error: {e}" for e in s["errors"]]
    return "\n".join(lines)
