"""The server's prefix cache through the official client: OpenAI's cached_tokens, vLLM's /reset_prefix_cache and
the Prometheus counters."""

from __future__ import annotations

import re


def _metric(server, name: str) -> float:
    text = server.get("/metrics").text
    return float(re.search(rf"^{name}\{{[^}}]*\}} (\S+)$", text, re.M).group(1))


def test_a_repeated_chat_prompt_reports_its_cached_tokens_and_reset_forgets_them(server, client, model_name):
    messages = [
        {"role": "system", "content": "You answer in one word. " * 12},
        {"role": "user", "content": "Name a colour."},
    ]
    assert server.post("/reset_prefix_cache").status_code == 200
    queries0 = _metric(server, "attnserve_prefix_cache_queries_total")
    hits0 = _metric(server, "attnserve_prefix_cache_hits_total")
    first = client.chat.completions.create(model=model_name, messages=messages, max_tokens=2, temperature=0)
    again = client.chat.completions.create(model=model_name, messages=messages, max_tokens=2, temperature=0)
    n = first.usage.prompt_tokens
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert again.usage.prompt_tokens_details.cached_tokens == (n - 1) // 16 * 16  # all full blocks but the last token
    assert again.choices[0].message.content == first.choices[0].message.content
    assert _metric(server, "attnserve_prefix_cache_queries_total") - queries0 == 2 * n
    assert _metric(server, "attnserve_prefix_cache_hits_total") - hits0 == (n - 1) // 16 * 16
    assert 0 < _metric(server, "attnserve_prefix_cache_hit_rate") <= 1

    assert server.post("/reset_prefix_cache").status_code == 200
    stream = client.chat.completions.create(
        model=model_name,
        messages=messages,
        max_tokens=2,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    usage = [c.usage for c in stream if c.usage is not None]
    assert usage[-1].prompt_tokens_details.cached_tokens == 0
