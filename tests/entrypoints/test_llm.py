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
