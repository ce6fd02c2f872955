"""vLLM's server surface beyond OpenAI's: /tokenize and /detokenize, chat templates (--chat-template, a request's
chat_template and chat_template_kwargs, add_generation_prompt, continue_final_message, echo), --generation-config,
--max-logprobs, and the request-field policy (a vLLM field attnserve does not implement: 400; an unknown field: one
warning line), through the real openai client where it can send the request."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from tests.entrypoints.openai.utils import RemoteServer

KEY = "sk-server-api"
# "<role>:<content>|" per message, "[flag]" when the variable is given, "A:" as the generation prompt
CUSTOM = (
    "{% for m in messages %}{{ m['role'] }}:{{ m['content'] }}|{% endfor %}"
    "{% if flag is defined %}[{{ flag }}]{% endif %}{% if add_generation_prompt %}A:{% endif %}"
)
HI = [{"role": "user", "content": "Hi"}]
GEN = {"temperature": 0.6, "top_k": 20, "max_new_tokens": 5}


@pytest.fixture(scope="module")
def custom(tiny_model_dir, tmp_path_factory):
    """A tiny Llama served with a custom chat template file, a generation config folder, --max-logprobs 3, request
    templates trusted and an API key."""
    folder = tmp_path_factory.mktemp("server_api")
    (folder / "template.jinja").write_text(CUSTOM)
    (folder / "generation_config.json").write_text(json.dumps(GEN))
    srv = RemoteServer(
        [
            tiny_model_dir("llama"),
            "--served-model-name",
            "tiny",
            "--chat-template",
            str(folder / "template.jinja"),
            "--generation-config",
            str(folder),
            "--max-logprobs",
            "3",
            "--trust-request-chat-template",
            "--log-level",
            "info",
        ],
        api_key=KEY,
    )
    yield srv
    srv.stop()


# --- /tokenize, /detokenize on the default model ------------------------------------------------------------------
def test_tokenize_a_prompt_and_back(server, default_tokenizer):
    r = server.post("/tokenize", json={"prompt": "Hello world", "return_token_strs": True})
    assert r.status_code == 200, r.text
    body = r.json()
    ids = default_tokenizer.encode("Hello world")
    assert body == {
        "count": len(ids),
        "max_model_len": 256,
        "tokens": ids,
        "token_strs": default_tokenizer.convert_ids_to_tokens(ids),
    }
    r = server.post("/detokenize", json={"tokens": ids})
    assert r.json() == {"prompt": default_tokenizer.decode(ids)}
    assert server.post("/tokenize", json={"prompt": "Hi"}).json()["token_strs"] is None


def test_tokenize_messages_is_the_chat_prompt(server, client, model_name, default_tokenizer):
    text = default_tokenizer.apply_chat_template(HI, tokenize=False, add_generation_prompt=True)
    r = server.post("/tokenize", json={"model": model_name, "messages": HI})
    assert r.json()["tokens"] == default_tokenizer.encode(text, add_special_tokens=False)
    # the same count the chat completion reports as its prompt
    chat = client.chat.completions.create(model=model_name, messages=HI, max_tokens=1)
    assert chat.usage.prompt_tokens == r.json()["count"]
    # the final message left open for the model to continue
    prefill = [*HI, {"role": "assistant", "content": "Hel"}]
    r = server.post(
        "/tokenize", json={"messages": prefill, "add_generation_prompt": False, "continue_final_message": True}
    )
    opened = default_tokenizer.apply_chat_template(prefill, tokenize=False, continue_final_message=True)
    assert opened.endswith("assistant\nHel")
    assert r.json()["tokens"] == default_tokenizer.encode(opened, add_special_tokens=False)


WEATHER_TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}


def test_tokenize_messages_with_tools_is_the_chat_prompt(server, client, model_name, default_tokenizer):
    r = server.post("/tokenize", json={"messages": HI, "tools": [WEATHER_TOOL]})
    assert r.status_code == 200, r.text
    text = default_tokenizer.apply_chat_template(HI, tools=[WEATHER_TOOL], tokenize=False, add_generation_prompt=True)
    assert r.json()["tokens"] == default_tokenizer.encode(text, add_special_tokens=False)
    chat = client.chat.completions.create(
        model=model_name, messages=HI, max_tokens=1, tools=[WEATHER_TOOL], tool_choice="none"
    )
    assert chat.usage.prompt_tokens == r.json()["count"]


@pytest.mark.parametrize(
    "path, body, param",
    [
        ("/tokenize", {"prompt": 5}, "prompt"),
        ("/tokenize", {"messages": HI, "tools": [{"type": "function"}]}, "tools.0.function"),
        ("/tokenize", {"messages": []}, "messages"),
        ("/tokenize", {"messages": HI, "continue_final_message": True}, "continue_final_message"),
        ("/tokenize", {"messages": HI, "chat_template": "{{ x }}"}, "chat_template"),  # not trusted here
        ("/tokenize", {"prompt": "x", "model": "other"}, "model"),
        ("/tokenize", {"messages": HI, "prompt": "x"}, "prompt"),
        ("/detokenize", {"tokens": [1, 10**9]}, "tokens.1"),
        ("/detokenize", {"tokens": "x"}, "tokens"),
        ("/detokenize", {"tokens": [-1]}, "tokens.0"),
        ("/tokenize", {"prompt": "x", "add_special_tokens": "yes"}, "add_special_tokens"),
        ("/tokenize", {"messages": HI, "chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs.tokenize"),
        ("/tokenize", {"prompt": "x", "mm_processor_kwargs": {"a": 1}}, "mm_processor_kwargs"),
        ("/tokenize", [1], None),
        ("/detokenize", "x", None),
    ],
)
def test_bad_tokenize_requests_are_400_naming_the_field(server, path, body, param):
    r = server.post(path, json=body)
    assert r.status_code in (400, 404), r.text
    assert r.json()["error"]["param"] == param


def test_a_body_that_is_no_json_object_is_400(server):
    for path in ("/tokenize", "/detokenize"):
        for content in (b"", b"{", b"\xff"):
            r = server.post(path, content=content, headers={"Content-Type": "application/json"})
            assert r.status_code == 400, (path, content, r.text)


# --- chat options on the default model ----------------------------------------------------------------------------
def test_both_generation_prompt_and_continue_final_message_are_refused(client, model_name):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=model_name, messages=HI, max_tokens=1, extra_body={"continue_final_message": True}
        )
    assert e.value.body["param"] == "continue_final_message"


def test_a_request_template_needs_the_trust_flag(client, model_name):
    for extra, param in (
        ({"chat_template": CUSTOM}, "chat_template"),
        ({"chat_template_kwargs": {"chat_template": CUSTOM}}, "chat_template_kwargs.chat_template"),
    ):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=model_name, messages=HI, max_tokens=1, extra_body=extra)
        assert e.value.body["param"] == param and "--trust-request-chat-template" in e.value.body["message"]


def test_echo_puts_the_assistants_last_message_first(client, model_name):
    prefill = [*HI, {"role": "assistant", "content": "Hel"}]
    extra = {"echo": True, "add_generation_prompt": False, "continue_final_message": True}
    r = client.chat.completions.create(
        model=model_name, messages=prefill, max_tokens=3, temperature=0, extra_body=extra
    )
    plain = client.chat.completions.create(
        model=model_name, messages=prefill, max_tokens=3, temperature=0, extra_body={**extra, "echo": False}
    )
    assert r.choices[0].message.content == "Hel" + plain.choices[0].message.content
    stream = client.chat.completions.create(
        model=model_name, messages=prefill, max_tokens=3, temperature=0, extra_body=extra, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == r.choices[0].message.content
    # a user's last message is not echoed
    r = client.chat.completions.create(
        model=model_name, messages=HI, max_tokens=2, temperature=0, extra_body={"echo": True}
    )
    again = client.chat.completions.create(model=model_name, messages=HI, max_tokens=2, temperature=0)
    assert r.choices[0].message.content == again.choices[0].message.content


# --- the request-field policy ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "field, value",
    [
        ("use_beam_search", True),
        ("length_penalty", 0.5),
        ("priority", 1),
        ("request_id", "abc"),
        ("logprob_token_ids", [1]),
        ("thinking_token_budget", 8),
    ],
)
def test_a_vllm_field_attnserve_does_not_implement_is_400(client, model_name, field, value):
    for create in (
        lambda **kw: client.completions.create(model=model_name, prompt="Hi", max_tokens=1, **kw),
        lambda **kw: client.chat.completions.create(model=model_name, messages=HI, max_tokens=1, **kw),
    ):
        with pytest.raises(openai.BadRequestError) as e:
            create(extra_body={field: value})
        assert e.value.body["param"] == field and "attnserve does not implement" in e.value.body["message"]


def test_a_vllm_fields_default_changes_nothing_and_is_accepted(client, model_name):
    extra = {
        "use_beam_search": False,
        "length_penalty": 1.0,
        "priority": 0,
        "request_id": None,
        "return_tokens_as_token_ids": False,
        "spaces_between_special_tokens": True,
        "min_tokens": 0,
    }
    a = client.completions.create(model=model_name, prompt="Hi", max_tokens=3, temperature=0, extra_body=extra)
    b = client.completions.create(model=model_name, prompt="Hi", max_tokens=3, temperature=0)
    assert a.choices[0].text == b.choices[0].text


def test_an_unknown_field_is_ignored_with_one_warning(server, client, model_name):
    r = client.completions.create(
        model=model_name, prompt="Hi", max_tokens=1, extra_body={"no_such_field_xyz": 1, "another_unknown_abc": True}
    )
    assert len(r.choices) == 1
    time.sleep(0.2)
    lines = [line for line in server.log_tail(200_000).splitlines() if "no_such_field_xyz" in line]
    assert len(lines) == 1 and "were present in the request but ignored" in lines[0]
    assert "another_unknown_abc" in lines[0]


def test_unknown_keys_of_chat_messages_are_named_in_one_warning(server, client, model_name):
    messages = [
        {"role": "system", "content": "Be brief.", "msg_key_xyz": 1},
        {"role": "user", "content": [{"type": "text", "text": "Hi", "part_key_abc": True}]},
    ]
    plain = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    r = client.chat.completions.create(model=model_name, messages=messages, max_tokens=3, temperature=0)
    same = client.chat.completions.create(model=model_name, messages=plain, max_tokens=3, temperature=0)
    assert r.choices[0].message.content == same.choices[0].message.content  # the chat template never saw them
    time.sleep(0.2)
    lines = [line for line in server.log_tail(200_000).splitlines() if "msg_key_xyz" in line]
    assert len(lines) == 1 and "were present in the request but ignored" in lines[0]
    assert "messages[0].msg_key_xyz" in lines[0] and "messages[1].content[0].part_key_abc" in lines[0]


# --- a server with its own template, generation config, --max-logprobs and an API key -------------------------
def test_tokenize_needs_the_api_key(custom):
    for path, body in (("/tokenize", {"prompt": "Hi"}), ("/detokenize", {"tokens": [1]})):
        assert httpx.post(custom.url + path, json=body).status_code == 401
        assert custom.post(path, json=body).status_code == 200


def test_the_servers_template_and_a_requests_own(custom, default_tokenizer):
    def tokens(**body):
        r = custom.post("/tokenize", json={"messages": HI, **body})
        assert r.status_code == 200, r.text
        return r.json()["tokens"]

    encode = lambda text: default_tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    assert tokens() == encode("user:Hi|A:")
    assert tokens(add_generation_prompt=False) == encode("user:Hi|")
    assert tokens(chat_template_kwargs={"flag": "x"}) == encode("user:Hi|[x]A:")
    assert tokens(chat_template="{% for m in messages %}<{{ m['content'] }}>{% endfor %}") == encode("<Hi>")
    chat = custom.openai().chat.completions.create(
        model="tiny", messages=HI, max_tokens=1, extra_body={"chat_template_kwargs": {"flag": "x"}}
    )
    assert chat.usage.prompt_tokens == len(encode("user:Hi|[x]A:"))
    with pytest.raises(openai.BadRequestError) as e:  # a trusted template that fails is still a 400
        custom.openai().chat.completions.create(
            model="tiny", messages=HI, max_tokens=1, extra_body={"chat_template": "{% for %}"}
        )
    assert e.value.body["param"] == "chat_template"


def test_generation_config_defaults_and_cap(custom):
    assert "default sampling values from" in custom.log_tail(200_000)
    client = custom.openai()
    # max_new_tokens 5 caps max_tokens, as vLLM's
    r = client.completions.create(model="tiny", prompt="Hi", max_tokens=12, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 5
    r = client.chat.completions.create(model="tiny", messages=HI, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 5

    # a request that leaves temperature and top_k unset samples with the config's 0.6 and 20: the same tokens as one
    # that sets them, under the same seed
    def text(**kw):
        return (
            client.completions.create(
                model="tiny",
                prompt="Hi",
                max_tokens=5,
                seed=7,
                extra_body={"ignore_eos": True, **kw.pop("extra", {})},
                **kw,
            )
            .choices[0]
            .text
        )

    assert text() == text(temperature=0.6, extra={"top_k": 20})


def test_max_logprobs_is_the_servers_limit(custom):
    client = custom.openai()
    r = client.completions.create(model="tiny", prompt="Hi", max_tokens=1, logprobs=3)
    assert len(r.choices[0].logprobs.top_logprobs[0]) >= 3
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt="Hi", max_tokens=1, logprobs=4)
    assert e.value.body["param"] == "logprobs" and "integer in [0, 3]" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=HI, max_tokens=1, logprobs=True, top_logprobs=4)
    assert e.value.body["param"] == "top_logprobs"
