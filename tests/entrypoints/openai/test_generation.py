"""Completions and chat completions through the official openai client: whole, streamed, n, stop, logprobs."""

from __future__ import annotations

import pytest

PROMPT = "The capital of France is"
MESSAGES = [{"role": "user", "content": "Name three colors."}]
GREEDY = dict(temperature=0, max_tokens=6)


@pytest.fixture(scope="module")
def greedy_completion(client, model_name):
    return client.completions.create(model=model_name, prompt=PROMPT, **GREEDY)


def test_completion(greedy_completion, model_name):
    r = greedy_completion
    assert r.object == "text_completion" and r.model == model_name
    (choice,) = r.choices
    assert choice.text and choice.finish_reason in ("length", "stop")
    assert r.usage.prompt_tokens > 0
    assert r.usage.completion_tokens == 6 or choice.finish_reason == "stop"
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_streamed_completion_concatenates_to_the_whole(client, model_name, greedy_completion):
    chunks = list(
        client.completions.create(
            model=model_name, prompt=PROMPT, stream=True, stream_options={"include_usage": True}, **GREEDY
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == greedy_completion.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == greedy_completion.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == greedy_completion.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == greedy_completion.usage.prompt_tokens


def test_token_id_prompts_and_batch(client, model_name, greedy_completion, default_tokenizer):
    ids = default_tokenizer.encode(PROMPT)
    r = client.completions.create(model=model_name, prompt=[ids, ids], **GREEDY)
    assert [c.index for c in r.choices] == [0, 1]
    assert all(c.text == greedy_completion.choices[0].text for c in r.choices)
    assert r.usage.prompt_tokens == 2 * greedy_completion.usage.prompt_tokens


def test_echo(client, model_name, greedy_completion):
    r = client.completions.create(model=model_name, prompt=PROMPT, echo=True, **GREEDY)
    assert r.choices[0].text == PROMPT + greedy_completion.choices[0].text


def test_n2_seeded_sampling(client, model_name):
    kw = dict(model=model_name, prompt=PROMPT, n=2, temperature=1.0, seed=1234, max_tokens=4)
    a, b = client.completions.create(**kw), client.completions.create(**kw)
    assert [c.index for c in a.choices] == [0, 1]
    assert [c.text for c in a.choices] == [c.text for c in b.choices]  # a seed makes sampling reproducible
    assert 2 <= a.usage.completion_tokens <= 8


def test_n2_greedy_streamed(client, model_name, greedy_completion):
    texts = ["", ""]
    for chunk in client.completions.create(model=model_name, prompt=PROMPT, n=2, stream=True, **GREEDY):
        for c in chunk.choices:
            texts[c.index] += c.text
    assert texts == [greedy_completion.choices[0].text] * 2


def test_stop_string(client, model_name, greedy_completion):
    full = greedy_completion.choices[0].text
    stop = full.strip().split()[1]  # the second word of the greedy text
    r = client.completions.create(model=model_name, prompt=PROMPT, stop=[stop], **GREEDY)
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == full[: full.index(stop)]
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(model=model_name, prompt=PROMPT, stop=stop, stream=True, **GREEDY)
    )
    assert streamed == r.choices[0].text


def test_logprobs(client, model_name, greedy_completion):
    r = client.completions.create(model=model_name, prompt=PROMPT, logprobs=3, **GREEDY)
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == greedy_completion.choices[0].text
    assert len(lp.token_logprobs) == len(lp.tokens) == len(lp.top_logprobs) == len(lp.text_offset)
    for tok, tok_lp, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert tok_lp <= 0 and len(top) >= 3
        assert tok_lp == pytest.approx(max(top.values()), abs=1e-4)  # greedy: the sampled token is the best
    assert lp.text_offset[0] == 0 and lp.text_offset[1] == len(lp.tokens[0])


def test_chat_completion_and_stream(client, model_name):
    r = client.chat.completions.create(model=model_name, messages=MESSAGES, **GREEDY)
    assert r.object == "chat.completion"
    msg = r.choices[0].message
    assert msg.role == "assistant" and msg.content
    chunks = list(
        client.chat.completions.create(
            model=model_name, messages=MESSAGES, stream=True, stream_options={"include_usage": True}, **GREEDY
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == msg.content
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == r.usage.prompt_tokens


def test_chat_logprobs_and_n(client, model_name):
    r = client.chat.completions.create(
        model=model_name, messages=MESSAGES, n=2, logprobs=True, top_logprobs=2, max_completion_tokens=4, temperature=0
    )
    assert len(r.choices) == 2 and r.choices[0].message.content == r.choices[1].message.content
    content = r.choices[0].logprobs.content
    assert "".join(t.token for t in content) == r.choices[0].message.content
    assert all(len(t.top_logprobs) == 2 and t.logprob == pytest.approx(t.top_logprobs[0].logprob) for t in content)


def test_models_version_health(server, client, model_name):
    assert model_name == "SmolLM2-135M-Instruct"
    card = server.get("/v1/models").json()["data"][0]
    assert card["max_model_len"] == 256
    assert server.get("/version").json()["version"]
    assert server.get("/health").status_code == 200


def test_started_with_503(server):
    """While the model loaded, /health and the API answered 503 with OpenAI's error body."""
    kinds = {kind for kind, status, _ in server.startup_statuses if status == 503}
    assert kinds == {"health", "completion"}, server.startup_statuses
    body = next(b for kind, _, b in server.startup_statuses if kind == "completion")
    assert body["error"]["type"] == "service_unavailable" and body["error"]["message"]


def test_metrics_parse(server, client, model_name):
    from prometheus_client.parser import text_string_to_metric_families

    client.completions.create(model=model_name, prompt=PROMPT, max_tokens=2, temperature=0)
    families = {f.name: f for f in text_string_to_metric_families(server.get("/metrics").text)}
    for name in (
        "attnserve_http_requests",
        "attnserve_request_success",
        "attnserve_time_to_first_token_seconds",
        "attnserve_time_per_output_token_seconds",
        "attnserve_e2e_request_latency_seconds",
        "attnserve_num_requests_running",
        "attnserve_num_requests_waiting",
        "attnserve_kv_cache_usage_perc",
        "attnserve_kv_cache_free_blocks",
        "attnserve_kv_cache_total_blocks",
        "attnserve_num_preemptions",
    ):
        assert name in families, name
    m = server.metrics()
    assert m["attnserve_time_to_first_token_seconds_count"] >= 1
    assert m["attnserve_e2e_request_latency_seconds_count"] >= 1
    assert m["attnserve_kv_cache_total_blocks"] > 0


def test_engine_counters_read_the_engine_snapshot():
    """The counters read at scrape time from the engine's snapshot (vLLM's prefix_cache_*, num_preemptions)."""
    from attnserve.engine.async_engine import EngineStats
    from attnserve.entrypoints.openai.metrics import ServerMetrics

    stats = EngineStats(prefix_cache_queries=48, prefix_cache_hits=32, num_preemptions=3)
    text = ServerMetrics("m", lambda: stats).render().decode()
    assert 'attnserve_num_preemptions_total{model_name="m"} 3.0' in text.splitlines()
    assert 'attnserve_prefix_cache_hits_total{model_name="m"} 32.0' in text.splitlines()


@pytest.mark.parametrize(
    "content, as_text", [([{"type": "text", "text": "Hi"}, {"type": "text", "text": " there"}], "Hi there")]
)
def test_chat_text_parts_render_as_llm_chat_does(client, model_name, default_tokenizer, content, as_text):
    # the server and LLM.chat share chat_utils.chat_messages: text parts are joined. (A message without content
    # is a 400 on the server, test_value_errors; LLM.chat refuses it too, test_llm.)
    message = {"role": "user", "content": content}
    r = client.chat.completions.create(model=model_name, messages=[message], **GREEDY)
    text = default_tokenizer.apply_chat_template(
        [{"role": "user", "content": as_text}], tokenize=False, add_generation_prompt=True
    )
    assert r.usage.prompt_tokens == len(default_tokenizer.encode(text, add_special_tokens=False))
