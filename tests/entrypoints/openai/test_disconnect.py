"""32 concurrent streaming clients, a third of them hanging up midway: the rest get the right text, the
server keeps answering, and every KV-cache block is free again afterwards."""

from __future__ import annotations

import asyncio
import time

PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):", "My favourite food is"]
KW = dict(temperature=0, max_tokens=6, extra_body={"ignore_eos": True})
NUM_CLIENTS = 32


async def _client(aclient, model_name, i: int) -> str | None:
    stream = await aclient.completions.create(model=model_name, prompt=PROMPTS[i % len(PROMPTS)], stream=True, **KW)
    text, chunks = "", 0
    async for chunk in stream:
        text += "".join(c.text for c in chunk.choices)
        chunks += 1
        if i % 3 == 0 and chunks == 2:  # hang up midway
            await stream.close()
            return None
    return text


async def _storm(server, model_name) -> list[str | None]:
    async with server.async_openai() as aclient:
        return await asyncio.gather(*(_client(aclient, model_name, i) for i in range(NUM_CLIENTS)))


def test_disconnect_storm_frees_kv_cache(server, client, model_name):
    reference = client.completions.create(model=model_name, prompt=PROMPTS, **KW)
    expected = [c.text for c in sorted(reference.choices, key=lambda c: c.index)]
    aborted_before = server.metrics().get("attnserve_request_aborted_total", 0.0)

    results = asyncio.run(_storm(server, model_name))

    completed = [(i, text) for i, text in enumerate(results) if text is not None]
    assert len(completed) == NUM_CLIENTS - len(range(0, NUM_CLIENTS, 3))
    for i, text in completed:
        assert text == expected[i % len(PROMPTS)], (i, text)

    # aborts travel through the engine thread: give it a moment, then every block must be free
    deadline = time.monotonic() + 30
    while True:
        m = server.metrics()
        idle = m["attnserve_num_requests_running"] == 0 and m["attnserve_num_requests_waiting"] == 0
        if idle and m["attnserve_kv_cache_free_blocks"] == m["attnserve_kv_cache_total_blocks"]:
            break
        assert time.monotonic() < deadline, m
        time.sleep(0.2)
    assert m["attnserve_kv_cache_usage_perc"] == 0.0
    assert m["attnserve_request_aborted_total"] - aborted_before >= len(range(0, NUM_CLIENTS, 3))

    after = client.completions.create(model=model_name, prompt=PROMPTS[0], **KW)
    assert after.choices[0].text == expected[0]


def test_non_streaming_client_gone_aborts(server, client, model_name):
    """A non-streamed request whose client times out is aborted too (the server watches for disconnect)."""
    import httpx

    aborted_before = server.metrics().get("attnserve_request_aborted_total", 0.0)
    body = {"model": model_name, "prompt": PROMPTS[1], "max_tokens": 200, "ignore_eos": True}
    try:
        httpx.post(server.url + "/v1/completions", json=body, timeout=2.0)
    except httpx.ReadTimeout:
        pass
    deadline = time.monotonic() + 30
    while True:
        m = server.metrics()
        if (
            m["attnserve_request_aborted_total"] > aborted_before
            and m["attnserve_kv_cache_free_blocks"] == m["attnserve_kv_cache_total_blocks"]
        ):
            break
        assert time.monotonic() < deadline, m
        time.sleep(0.2)
    assert client.completions.create(model=model_name, prompt="Hi", max_tokens=1).choices
