"""The prompt checks the server shares with LLM.generate and ``attnserve generate`` (engine/request_checks.py): the
same rule and words, the place dotted as ``param`` (``prompt.1.2``) and the value as JSON. A prompt too long names
the prompt (``prompt``, ``prompt.1``, ``messages``) when it alone leaves no room for the completion, and the max-tokens
field the request set when the prompt fits but not with it (was ``max_tokens`` for both)."""

from __future__ import annotations

import openai
import pytest

from tests.entrypoints.openai.conftest import MAX_MODEL_LEN
from tests.entrypoints.openai.utils import assert_refused

VOCAB = 49152  # the default model's (SmolLM2-135M)
TOKEN_IDS = f"integer in [0, {VOCAB}), the vocabulary size"


def too_long(n: int) -> str:
    return (
        f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, the prompt has {n} tokens, which "
        f"leaves no room for the completion (at most {MAX_MODEL_LEN - 1} prompt tokens fit). Please raise "
        "max_model_len or reduce the length of the prompt."
    )


def too_many(n: int, max_tokens: int) -> str:
    return (
        f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, you requested {n + max_tokens} "
        f"tokens ({n} in the prompt, {max_tokens} in the completion). Please reduce the length of the prompt or "
        "completion."
    )


COMPLETION_REFUSALS = {
    # a token id outside the vocabulary by its position (was param "prompt", "token id 49152 is out of range
    # (vocabulary size 49152)")
    "token_id": ({"prompt": [1, 2, VOCAB]}, "prompt.2", (str(VOCAB), TOKEN_IDS)),
    "token_id_in_second_prompt": ({"prompt": [[1], [1, 10**9]]}, "prompt.1.1", ("1000000000", TOKEN_IDS)),
    # the prompt alone: param the prompt (was max_tokens, with "you requested 307 tokens (300 in the prompt, 7 in the
    # completion)"; and "the prompt has 256 tokens, which leaves no room in the context of 256" without max_tokens)
    "prompt_too_long": ({"prompt": [1] * 300, "max_tokens": 7}, "prompt", too_long(300)),
    "prompt_too_long_max_tokens_null": (
        {"prompt": [1] * MAX_MODEL_LEN, "max_tokens": None},
        "prompt",
        too_long(MAX_MODEL_LEN),
    ),
    "second_prompt_too_long": ({"prompt": [[1], [1] * 300]}, "prompt.1", too_long(300)),
    # the prompt fits, not with max_tokens more
    "max_tokens": ({"prompt": [1] * 250, "max_tokens": 10}, "max_tokens", too_many(250, 10)),
    "max_tokens_second_prompt": ({"prompt": [[1], [1] * 250], "max_tokens": 10}, "max_tokens", too_many(250, 10)),
}


@pytest.mark.parametrize("case", list(COMPLETION_REFUSALS), ids=list(COMPLETION_REFUSALS))
def test_completion_prompt_refusals(server, case):
    body, param, message = COMPLETION_REFUSALS[case]
    r = server.post("/v1/completions", json={"max_tokens": 2, **body})
    assert r.status_code == 400
    if isinstance(message, tuple):  # (the value as sent, allowed)
        assert_refused(r.json()["error"], param, *message)
    else:  # OpenAI's own words for the context length
        assert r.json() == {
            "error": {"message": message, "type": "invalid_request_error", "param": param, "code": None}
        }


def test_a_prompt_up_to_the_whole_context_runs(server):
    """The ends of the rule: prompt + max_tokens == max_model_len, and max_tokens null takes the rest."""
    assert server.post("/reset_prefix_cache").status_code == 200  # earlier tests' prompts are not found cached
    r = server.post(
        "/v1/completions", json={"prompt": [1] * 250, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    )
    assert r.status_code == 200, r.text
    assert r.json()["usage"] == {
        "prompt_tokens": 250,
        "completion_tokens": 6,
        "total_tokens": 256,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    r = server.post("/v1/completions", json={"prompt": [1] * 255, "max_tokens": None, "temperature": 0})
    assert r.status_code == 200, r.text
    # the first request computed 255 positions (its last token's K/V never): 15 full blocks of 16 are cached
    assert r.json()["usage"]["prompt_tokens_details"] == {"cached_tokens": 240}
    assert r.json()["usage"]["completion_tokens"] == 1


def _chat_tokens(tokenizer, messages) -> int:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return len(tokenizer.encode(text, add_special_tokens=False))


@pytest.mark.parametrize("field", [None, "max_tokens", "max_completion_tokens"])
def test_chat_messages_too_long_name_messages(client, model_name, default_tokenizer, field):
    messages = [{"role": "user", "content": "hello " * MAX_MODEL_LEN}]
    n = _chat_tokens(default_tokenizer, messages)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model_name, messages=messages, **({field: 5} if field else {}))
    assert e.value.body == {"message": too_long(n), "type": "invalid_request_error", "param": "messages", "code": None}


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_chat_max_tokens_beyond_the_context_names_the_field_sent(client, model_name, default_tokenizer, field):
    messages = [{"role": "user", "content": "Hi"}]
    n = _chat_tokens(default_tokenizer, messages)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model_name, messages=messages, **{field: MAX_MODEL_LEN})
    assert e.value.body == {
        "message": too_many(n, MAX_MODEL_LEN),
        "type": "invalid_request_error",
        "param": field,
        "code": None,
    }
