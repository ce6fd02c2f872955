"""The offline ``LLM`` API's input shapes (vLLM's): prompt dicts and chat messages, on a tiny random Llama."""

from __future__ import annotations

import pytest

from attnserve import LLM, SamplingParams
from attnserve.engine.request_checks import MaxTokensTooLargeError, PromptTooLongError, RequestValueError

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


# the server's words (its request schema's; test_chat_utils.py holds chat_utils to them), Python's places and values
ROLES = '"system", "developer", "user", "assistant", "tool"'
CONTENT = 'a string, or a non-empty list of text parts {"type": "text", "text": string}'
MESSAGES = "a non-empty list of chat messages"
HI = [{"role": "user", "content": "Hi"}]


@pytest.mark.parametrize("messages, message", [
    ([{"content": "Hi"}], f"messages[0].role missing (required: {ROLES})"),
    ([{"role": "user", "content": "Hi"}, {"role": "bot", "content": "x"}],
     f"messages[1].role 'bot' not allowed (allowed: {ROLES})"),
    ([{"role": "user", "content": 5}], f"messages[0].content 5 not allowed (allowed: {CONTENT})"),
    ([{"role": "user", "content": "Hi", "name": 3}], "messages[0].name 3 is not a string (allowed: string, or None)"),
    # a batch's conversation by its index (was "conversation 1: messages[0]...")
    ([HI, [{"role": "user", "content": [{"type": "image_url"}]}]],
     "messages[1][0].content[0].type 'image_url' not allowed (allowed: \"text\")"),
    ([HI, [{"role": "user", "content": [{"type": "text"}]}]],
     "messages[1][0].content[0].text missing (required: a string)"),
    ([{"role": "user", "content": [{"type": "text", "text": "Hi"}, 5]}],
     'messages[0].content[1] 5 is not a text part {"type": "text", "text": string} (allowed: an object with "type" '
     'and "text")'),
    # content is required whatever the role, as the server requires it (was read as "", a message never written);
    # an assistant may go without it in OpenAI's API only with tool calls, which attnserve has not
    ([{"role": "user"}], f"messages[0].content missing (required: {CONTENT})"),
    ([{"role": "system", "content": "Be brief."}, {"role": "user"}], f"messages[1].content missing (required: {CONTENT})"),
    ([{"role": "user", "content": "Hi"}, {"role": "assistant"}, {"role": "user", "content": "Hi"}],
     f"messages[1].content missing (required: {CONTENT})"),
    ([{"role": "user", "content": None}], f"messages[0].content None not allowed (allowed: {CONTENT})"),
    ([HI, [{"role": "user"}]], f"messages[1][0].content missing (required: {CONTENT})"),
    ([HI, []], f"messages[1] [] not allowed (allowed: {MESSAGES})"),
    ([HI, "Hi"], f"messages[1] 'Hi' is not a list (allowed: {MESSAGES})"),
    # were accepted: content [] (rendered as an empty message), as the server refuses it
    ([{"role": "user", "content": []}], f"messages[0].content [] not allowed (allowed: {CONTENT})"),
    # the messages themselves: LLM.chat takes one conversation or a list of them (were: "messages [] not allowed
    # (allowed: a non-empty list of message dicts)", and for "hi" "messages[0] 'h' not allowed", its first character)
    ([], f"messages [] not allowed (allowed: {MESSAGES}, or a list of such lists)"),
    ("hi", f"messages 'hi' is not a list (allowed: {MESSAGES}, or a list of such lists)"),
    ({"role": "user", "content": "Hi"},
     f"messages {{'role': 'user', 'content': 'Hi'}} is not a list (allowed: {MESSAGES}, or a list of such lists)"),
    (None, f"messages None is not a list (allowed: {MESSAGES}, or a list of such lists)"),
    ([1], 'messages[0] 1 is not a chat message (allowed: an object with "role" and "content", optionally "name")'),
    (["hi"], 'messages[0] \'hi\' is not a chat message (allowed: an object with "role" and "content", optionally '
             '"name")'),
])
def test_bad_chat_messages_are_refused_up_front(llm, messages, message):
    with pytest.raises(RequestValueError) as e:
        llm.chat(messages, GREEDY)
    assert str(e.value) == message and isinstance(e.value, ValueError)
    assert not llm.engine.has_unfinished_requests()


# LLM.generate refuses what the server refuses, in its words (engine/request_checks.py), before any work: the place
# as Python indexes it (the server's param dotted: prompt.1.2), the value as Python writes it (the server's as JSON)
VOCAB = 49152  # the tiny models' (the default model's tokenizer)
TOKEN_IDS = f"integer in [0, {VOCAB}), the vocabulary size"
EMPTY = "a prompt of at least 1 token"
SHORT_LEN = 16
TOO_LONG = (f"This model's maximum context length is {SHORT_LEN} tokens. However, {{}} has 20 tokens, which leaves no "
            f"room for the completion (at most {SHORT_LEN - 1} prompt tokens fit). Please raise max_model_len or reduce "
            "the length of the prompt.")
TOO_MANY = (f"This model's maximum context length is {SHORT_LEN} tokens. However, you requested 18 tokens (10 in {{}}, "
            "8 in the completion). Please reduce the length of the prompt or completion.")


@pytest.fixture(scope="module")
def short_llm(tiny_model_dir):
    return LLM(tiny_model_dir("llama"), dtype="float32", device="cpu", block_size=4, kv_cache_memory=8 << 20,
               max_model_len=SHORT_LEN)


GENERATE_REFUSALS = {
    # an empty prompt, whatever its form (was "prompt is empty (0 tokens)", and "" ran as a lone BOS token where
    # the tokenizer adds one)
    "empty_text": ("", 1, RequestValueError, f"prompt '' not allowed (allowed: {EMPTY})"),
    "empty_text_in_batch": (["Hi", ""], 1, RequestValueError, f"prompts[1] '' not allowed (allowed: {EMPTY})"),
    "empty_token_ids_in_batch": ([[1], []], 1, RequestValueError, f"prompts[1] [] not allowed (allowed: {EMPTY})"),
    "empty_prompt_dict": ({"prompt": ""}, 1, RequestValueError, f"prompt '' not allowed (allowed: {EMPTY})"),
    "empty_token_ids_dict": ({"prompt_token_ids": []}, 1, RequestValueError,
                             f"prompt [] not allowed (allowed: {EMPTY})"),
    # a token id outside the vocabulary by its position (was "token id 49152 not allowed (...)")
    "token_id": ([1, 2, VOCAB], 1, RequestValueError, f"prompt[2] {VOCAB} not allowed (allowed: {TOKEN_IDS})"),
    "token_id_in_batch": ([[1], [1, -1]], 1, RequestValueError, f"prompts[1][1] -1 not allowed (allowed: {TOKEN_IDS})"),
    "token_id_in_dict": ({"prompt_token_ids": [10**9]}, 1, RequestValueError,
                         f"prompt[0] 1000000000 not allowed (allowed: {TOKEN_IDS})"),
    # the prompt alone leaves no room: the server's words and rule (was "prompt has 20 tokens; max_model_len is 16,
    # ...")
    "prompt_too_long": ([1] * 20, None, PromptTooLongError, TOO_LONG.format("the prompt")),
    "prompt_too_long_in_batch": ([[1], [1] * 20], 1, PromptTooLongError, TOO_LONG.format("prompts[1]")),
    # the prompt fits but not with max_tokens more (was accepted, and ran to max_model_len: one CPU call of a
    # fresh-user trial ran for over 10 minutes)
    "max_tokens": ([1] * 10, 8, MaxTokensTooLargeError, TOO_MANY.format("the prompt")),
    "max_tokens_in_batch": ([[1], [1] * 10], 8, MaxTokensTooLargeError, TOO_MANY.format("prompts[1]")),
}


@pytest.mark.parametrize("case", list(GENERATE_REFUSALS), ids=list(GENERATE_REFUSALS))
def test_generate_refuses_as_the_server_does(short_llm, case):
    prompts, max_tokens, error, message = GENERATE_REFUSALS[case]
    with pytest.raises(error) as e:
        short_llm.generate(prompts, SamplingParams(max_tokens=max_tokens))
    assert str(e.value) == message and isinstance(e.value, ValueError)
    assert not short_llm.engine.has_unfinished_requests()  # refused before anything was queued


def test_generate_runs_a_prompt_up_to_the_whole_context(short_llm):
    """The ends of the rule: prompt + max_tokens == max_model_len runs, max_tokens None takes the rest."""
    greedy = dict(temperature=0.0, ignore_eos=True)
    (out,) = short_llm.generate([1] * 10, SamplingParams(max_tokens=6, **greedy))
    assert len(out.outputs[0].token_ids) == 6 and out.outputs[0].finish_reason == "length"
    (out,) = short_llm.generate([1] * 15, SamplingParams(max_tokens=None, **greedy))
    assert len(out.outputs[0].token_ids) == 1


def test_chat_refuses_a_conversation_too_long_as_generate_does(llm, short_llm):
    messages = [{"role": "user", "content": "Hi"}]
    n = len(llm.tokenizer.encode(_rendered(llm, messages), add_special_tokens=False))  # 31: a default system prompt
    limit = llm.engine.max_model_len
    with pytest.raises(MaxTokensTooLargeError) as e:
        llm.chat([messages, messages], SamplingParams(max_tokens=limit))
    assert str(e.value) == (f"This model's maximum context length is {limit} tokens. However, you requested "
                            f"{n + limit} tokens ({n} in messages[0], {limit} in the completion). Please reduce "
                            "the length of the prompt or completion.")
    with pytest.raises(PromptTooLongError) as e:
        short_llm.chat(messages, SamplingParams(max_tokens=1))
    assert str(e.value) == (f"This model's maximum context length is {SHORT_LEN} tokens. However, the prompt has {n} "
                            f"tokens, which leaves no room for the completion (at most {SHORT_LEN - 1} prompt tokens "
                            "fit). Please raise max_model_len or reduce the length of the prompt.")
    assert not llm.engine.has_unfinished_requests() and not short_llm.engine.has_unfinished_requests()


def test_chat_takes_vllms_template_options(llm):
    template = ("{% for m in messages %}{{ m['role'] }}:{{ m['content'] }}|{% endfor %}"
                "{% if flag is defined %}[{{ flag }}]{% endif %}{% if add_generation_prompt %}A:{% endif %}")
    (out,) = llm.chat(HI, GREEDY, chat_template=template, chat_template_kwargs={"flag": 1})
    assert out.prompt == "user:Hi|[1]A:"
    assert out.prompt_token_ids == llm.tokenizer.encode("user:Hi|[1]A:", add_special_tokens=False)
    prefill = [*HI, {"role": "assistant", "content": "Hel"}]
    (out,) = llm.chat(prefill, GREEDY, chat_template=template, add_generation_prompt=False, continue_final_message=True)
    assert out.prompt == "user:Hi|assistant:Hel"
    with pytest.raises(ValueError) as e:  # both: refused before anything is queued, as vLLM refuses it
        llm.chat(prefill, GREEDY, continue_final_message=True)
    assert e.value.path == ("continue_final_message",)
    assert not llm.engine.has_unfinished_requests()
