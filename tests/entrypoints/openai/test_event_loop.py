"""The event loop stays free while a long prompt is tokenized (on the tokenizer thread, ``tokenizer_thread.py``):
other routes are answered meanwhile, and the long prompt's own answer is what it was. A real server with a tiny
random model and the default tokenizer, a real HTTP client."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.entrypoints.openai.utils import RemoteServer

# ~0.9 MB of text: ~0.9 s of tokenizing here (a 3 MB prompt held /health for 5.4 s before), ~10 ms to answer /health
WORDS = "The quick brown fox jumps over the lazy dog. "
REPS = 20_000
PROMPT_TOKENS = {"completions": 10 * REPS + 1, "chat/completions": 10 * REPS + 31}  # the default tokenizer's count
MAX_MODEL_LEN = 512  # the tiny model's max_position_embeddings
TOKEN_IDS = [504, 3575, 282]  # "The capital of" in the default tokenizer


@pytest.fixture(scope="module")
def tiny_server(tiny_model_dir):
    srv = RemoteServer([tiny_model_dir("llama"), "--served-model-name", "tiny", "--log-level", "warning"])
    yield srv
    srv.stop()


def _long_body(endpoint: str) -> bytes:
    text = WORDS * REPS
    body = (
        {"prompt": text, "max_tokens": 1}
        if endpoint == "completions"
        else {"messages": [{"role": "user", "content": text}], "max_tokens": 1}
    )
    return json.dumps(body).encode()


async def _meanwhile(url: str, endpoint: str) -> tuple[list[str], dict[str, httpx.Response]]:
    """Send the long prompt; once its body is out (the server then tokenizes it), ask /health, /v1/models and a
    completion of token ids (which needs no tokenizer) one after another. Returns the order the answers came in
    and the answers."""
    order: list[str] = []
    answers: dict[str, httpx.Response] = {}
    body = _long_body(endpoint)
    body_sent = asyncio.Event()

    async def chunks():
        for i in range(0, len(body), 1 << 16):
            yield body[i : i + (1 << 16)]
        body_sent.set()  # httpx asks for the next chunk once it has written the last one

    async def ask(name: str, request) -> None:
        answers[name] = await request
        order.append(name)

    async with httpx.AsyncClient(timeout=120) as client:
        long = asyncio.create_task(
            ask(
                "long prompt",
                client.post(
                    f"{url}/v1/{endpoint}",
                    content=chunks(),
                    headers={"Content-Type": "application/json", "Content-Length": str(len(body))},
                ),
            )
        )
        await body_sent.wait()
        await asyncio.sleep(0.1)  # the last bytes reach the server; it parses the body and starts tokenizing
        await ask("health", client.get(f"{url}/health"))
        await ask("models", client.get(f"{url}/v1/models"))
        await ask(
            "token ids",
            client.post(f"{url}/v1/completions", json={"prompt": TOKEN_IDS, "max_tokens": 2, "temperature": 0}),
        )
        await long
    return order, answers


@pytest.mark.parametrize("endpoint", ["completions", "chat/completions"])
def test_other_requests_are_answered_while_a_long_prompt_is_tokenized(tiny_server, endpoint):
    """Before, tokenizing ran on the event loop: a /health sent meanwhile waited for it (5.4 s for a 3 MB prompt) and
    came after the long prompt's answer. Now /health, /v1/models and a completion of token ids all come back while
    the long prompt is still in flight; the long prompt's answer is the 400 it was (tokenized, then too long)."""
    order, answers = asyncio.run(_meanwhile(tiny_server.url, endpoint))
    assert order == ["health", "models", "token ids", "long prompt"]
    assert answers["health"].status_code == 200
    assert [m["id"] for m in answers["models"].json()["data"]] == ["tiny"]
    assert answers["token ids"].status_code == 200
    assert answers["token ids"].json()["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 2,
        "total_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    n = PROMPT_TOKENS[endpoint]
    assert answers["long prompt"].status_code == 400
    assert answers["long prompt"].json() == {
        "error": {
            "message": f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, the prompt has {n} "
            f"tokens, which leaves no room for the completion (at most {MAX_MODEL_LEN - 1} prompt tokens "
            "fit). Please raise max_model_len or reduce the length of the prompt.",
            "type": "invalid_request_error",
            "param": "messages" if endpoint.startswith("chat") else "prompt",
            "code": None,
        }
    }


def test_text_prompts_sent_together_are_each_answered_as_when_sent_alone(tiny_server):
    """The tokenizer thread takes one prompt at a time: prompts sent at once, with a long one among them, each get
    the completion they get alone (no tokenizer error from calls in two threads, no prompt mixed up with another)."""
    prompts = [f"Request number {i} says" for i in range(6)]
    request = {"max_tokens": 4, "temperature": 0}
    alone = [
        tiny_server.post("/v1/completions", json={"prompt": p, **request}).json()["choices"][0]["text"] for p in prompts
    ]

    async def together() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=120) as client:
            long = client.post(
                f"{tiny_server.url}/v1/completions",
                content=_long_body("completions"),
                headers={"Content-Type": "application/json"},
            )
            return await asyncio.gather(
                long,
                *(client.post(f"{tiny_server.url}/v1/completions", json={"prompt": p, **request}) for p in prompts),
            )

    long, *answers = asyncio.run(together())
    assert long.status_code == 400
    assert [a.status_code for a in answers] == [200] * len(prompts)
    assert [a.json()["choices"][0]["text"] for a in answers] == alone


@pytest.mark.parametrize("stream", [False, True])
def test_echo_of_a_token_id_prompt_is_its_decoded_text(tiny_server, default_tokenizer, stream):
    """echo decodes a token-id prompt (on the tokenizer thread); without echo nothing decodes it."""
    request = {"prompt": TOKEN_IDS, "max_tokens": 3, "temperature": 0}
    plain = tiny_server.post("/v1/completions", json=request).json()["choices"][0]["text"]
    r = tiny_server.post("/v1/completions", json={**request, "echo": True, "stream": stream})
    assert r.status_code == 200
    if stream:
        events = [line[len("data: ") :] for line in r.text.splitlines() if line.startswith("data: ")]
        text = "".join(c["text"] for e in events[:-1] for c in json.loads(e)["choices"])
    else:
        text = r.json()["choices"][0]["text"]
    assert default_tokenizer.decode(TOKEN_IDS) == "The capital of"
    assert text == "The capital of" + plain
