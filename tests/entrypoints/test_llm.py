"""The offline ``LLM`` API's input shapes (vLLM's): prompt dicts and chat messages, on a tiny random Llama."""

from __future__ import annotations

import pytest

from attnserve import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
IDS = [504, 3575, 282, 4649, 314]


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    return LLM(tiny_model_dir("llama"), dtype="float32", device="cpu", block_size=4, kv_cache_memory=8 << 20)


def test_a_tokens_prompt_dict_equals_its_token_ids(llm):
    (ref,) = llm.generate(IDS, GREEDY)
    (out,) = llm.generate({"prompt_token_ids": IDS}, GREEDY)
    assert out.outputs[0].token_ids == ref.outputs[0].token_ids
    assert out.prompt is None and out.prompt_token_ids == IDS  # as for a plain token-id list


def test_text_and_tokens_prompt_dicts_mixed_with_plain_prompts(llm):
    outs = llm.generate([{"prompt": "Hi"}, "Hi", {"prompt_token_ids": IDS}, IDS], GREEDY)
    hi_ids = llm.tokenizer.encode("Hi")
    assert [o.prompt for o in outs] == ["Hi", "Hi", None, None]
    assert [o.prompt_token_ids for o in outs] == [hi_ids, hi_ids, IDS, IDS]
    assert outs[0].outputs[0].token_ids == outs[1].outputs[0].token_ids
    assert outs[2].outputs[0].token_ids == outs[3].outputs[0].token_ids


@pytest.mark.parametrize("prompt, message", [
    ({"prompt": "Hi", "prompt_token_ids": IDS}, "prompt dict with keys ['prompt', 'prompt_token_ids'] not allowed"),
    ({"text": "Hi"}, "prompt dict with keys ['text'] not allowed"),
    ({}, "prompt dict with keys [] not allowed"),
    ({"prompt": IDS}, f"prompt dict 'prompt' value {IDS!r} not allowed (allowed: a string)"),
    ({"prompt_token_ids": "Hi"}, "prompt dict 'prompt_token_ids' value 'Hi' not allowed (allowed: a list of token ids)"),
])
def test_other_prompt_dicts_are_refused_up_front(llm, prompt, message):
    with pytest.raises(ValueError) as e:
        llm.generate(["Hi", prompt], GREEDY)
    assert str(e.value).startswith(message)
    if "keys" in message:
        assert str(e.value).endswith("(allowed: exactly one of {'prompt': str} or {'prompt_token_ids': list[int]})")
    assert not llm.engine.has_unfinished_requests()


def _rendered(llm, messages):
    return llm.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def test_chat_output_carries_the_rendered_prompt(llm):
    messages = [{"role": "user", "content": "Hi"}]
    (out,) = llm.chat(messages, GREEDY)
    assert out.prompt == _rendered(llm, messages)
    assert out.prompt_token_ids == llm.tokenizer.encode(out.prompt, add_special_tokens=False)


def test_chat_message_with_empty_content_is_that_empty_text(llm):
    (out,) = llm.chat([{"role": "user", "content": ""}], GREEDY)
    assert out.prompt == _rendered(llm, [{"role": "user", "content": ""}])


def test_chat_text_parts_are_joined_as_in_the_server(llm):
    parts = [{"type": "text", "text": "Hi"}, {"type": "text", "text": " there"}]
    (out,) = llm.chat([{"role": "user", "content": parts}], GREEDY)
    assert out.prompt == _rendered(llm, [{"role": "user", "content": "Hi there"}])


ROLES = "['system', 'developer', 'user', 'assistant', 'tool']"


CONTENT = "a string or a list of {'type': 'text', 'text': str} parts"


@pytest.mark.parametrize("messages, message", [
    ([{"content": "Hi"}], f"messages[0].role missing (required: one of {ROLES})"),
    ([{"role": "user", "content": "Hi"}, {"role": "bot", "content": "x"}],
     f"messages[1].role 'bot' not allowed (allowed: one of {ROLES})"),
    ([{"role": "user", "content": 5}], f"messages[0].content 5 not allowed (allowed: {CONTENT})"),
    ([{"role": "user", "content": "Hi", "name": 3}], "messages[0].name 3 not allowed (allowed: a string or None)"),
    ([[{"role": "user", "content": "Hi"}], [{"role": "user", "content": [{"type": "image_url"}]}]],
     "conversation 1: messages[0].content [{'type': 'image_url'}] not allowed"),
    # content is required whatever the role, as the server requires it (was read as "", a message never written);
    # an assistant may go without it in OpenAI's API only with tool calls, which attnserve has not
    ([{"role": "user"}], f"messages[0].content missing (required: {CONTENT})"),
    ([{"role": "system", "content": "Be brief."}, {"role": "user"}], f"messages[1].content missing (required: {CONTENT})"),
    ([{"role": "user", "content": "Hi"}, {"role": "assistant"}, {"role": "user", "content": "Hi"}],
     f"messages[1].content missing (required: {CONTENT})"),
    ([{"role": "user", "content": None}], f"messages[0].content None not allowed (allowed: {CONTENT})"),
    ([[{"role": "user", "content": "Hi"}], [{"role": "user"}]],
     f"conversation 1: messages[0].content missing (required: {CONTENT})"),
    ([[{"role": "user", "content": "Hi"}], []],
     "conversation 1: messages [] not allowed (allowed: a non-empty list of message dicts)"),
])
def test_bad_chat_messages_are_refused_up_front(llm, messages, message):
    with pytest.raises(ValueError) as e:
        llm.chat(messages, GREEDY)
    assert str(e.value).startswith(message)
    assert not llm.engine.has_unfinished_requests()


def test_chat_message_without_content_is_refused_naming_it(llm):
    with pytest.raises(ValueError) as e:
        llm.chat([{"role": "user", "content": "Hi"}, {"role": "assistant"}], GREEDY)
    assert str(e.value) == ("messages[1].content missing (required: a string or a list of {'type': 'text', 'text': str} "
                            "parts)")
    assert not llm.engine.has_unfinished_requests()
