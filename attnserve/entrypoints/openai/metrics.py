"""Prometheus metrics of one server: request counts, latency histograms, engine load and KV-cache use.

Each server owns its own CollectorRegistry (no module-level metric objects), so two servers in one
process, or tests, never share counters. Engine gauges are read from the engine's latest EngineStats
snapshot at scrape time.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from attnserve.engine.async_engine import EngineStats

# seconds; fine at the low end (GPU decode steps) and wide enough for CPU runs
_LATENCY_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
)
_TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)


class ServerMetrics:
    """All of a server's metrics, registered on a private registry."""

    def __init__(self, model_name: str, stats: Callable[[], EngineStats]) -> None:
        self.registry = CollectorRegistry()
        r, labels = self.registry, ["model_name"]
        self.http_requests = Counter(
            "attnserve_http_requests",
            "HTTP requests to the API, by endpoint and status code",
            ["endpoint", "status_code"],
            registry=r,
        )
        self.requests_finished = Counter(
            "attnserve_request_success",
            "Generation requests that finished, by finish reason",
            ["model_name", "finished_reason"],
            registry=r,
        )
        self.requests_aborted = Counter(
            "attnserve_request_aborted", "Generation requests aborted (client gone or shutdown)", labels, registry=r
        )
        self.prompt_tokens = Counter("attnserve_prompt_tokens", "Prompt tokens processed", labels, registry=r)
        self.generation_tokens = Counter("attnserve_generation_tokens", "Tokens generated", labels, registry=r)
        self.ttft = Histogram(
            "attnserve_time_to_first_token_seconds", "Time to first token", labels, buckets=_LATENCY_BUCKETS, registry=r
        )
        self.tpot = Histogram(
            "attnserve_time_per_output_token_seconds",
            "Time per output token after the first",
            labels,
            buckets=_TOKEN_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "attnserve_e2e_request_latency_seconds",
            "End-to-end request latency",
            labels,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        gauges = {
            "attnserve_num_requests_running": ("Sequences running in the engine", lambda s: s.num_running),
            "attnserve_num_requests_waiting": ("Sequences waiting to be scheduled", lambda s: s.num_waiting),
            "attnserve_kv_cache_usage_perc": (
                "Fraction of KV-cache blocks in use (0 to 1)",
                lambda s: s.kv_cache_usage,
            ),
            "attnserve_kv_cache_free_blocks": ("Free KV-cache blocks", lambda s: s.num_free_blocks),
            "attnserve_kv_cache_total_blocks": ("KV-cache blocks in all", lambda s: s.num_blocks),
            "attnserve_prefix_cache_hit_rate": (
                "Prompt tokens found in the prefix cache / tokens looked up, since start (0 to 1)",
                lambda s: s.prefix_cache_hit_rate,
            ),
        }
        self.model_name = model_name
        for name, (doc, read) in gauges.items():
            g = Gauge(name, doc, labels, registry=r)
            g.labels(model_name).set_function(lambda read=read: float(read(stats())))
        r.register(_EngineCounters(model_name, stats))

    def observe_request(
        self, ttft: float | None, e2e: float, num_output_tokens: int, num_prompt_tokens: int, finish_reasons: list[str]
    ) -> None:
        """Record one finished generation request (times in seconds, measured by the server)."""
        m = self.model_name
        if ttft is not None:
            self.ttft.labels(m).observe(ttft)
            if num_output_tokens > 1:
                self.tpot.labels(m).observe((e2e - ttft) / (num_output_tokens - 1))
        self.e2e.labels(m).observe(e2e)
        self.prompt_tokens.labels(m).inc(num_prompt_tokens)
        self.generation_tokens.labels(m).inc(num_output_tokens)
        for reason in finish_reasons:
            self.requests_finished.labels(m, reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _EngineCounters(Collector):
    """vLLM's ``prefix_cache_queries`` / ``prefix_cache_hits`` counters (prompt tokens looked up in the prefix
    cache, and found) and its ``num_preemptions``, read from the engine's counts at scrape time."""

    def __init__(self, model_name: str, stats: Callable[[], EngineStats]) -> None:
        self.model_name = model_name
        self.stats = stats

    def collect(self):
        s = self.stats()
        for name, doc, value in (
            ("attnserve_prefix_cache_queries", "Prompt tokens looked up in the prefix cache", s.prefix_cache_queries),
            ("attnserve_prefix_cache_hits", "Prompt tokens found in the prefix cache", s.prefix_cache_hits),
            ("attnserve_num_preemptions", "Requests preempted (blocks freed, recomputed later)", s.num_preemptions),
        ):
            family = CounterMetricFamily(name, doc, labels=["model_name"])
            family.add_metric([self.model_name], value)
            yield family
