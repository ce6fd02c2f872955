"""Chat templates (chat_utils): vLLM's --chat-template reading, the options a request gives (add_generation_prompt,
continue_final_message, chat_template_kwargs) and their refusals; on the default model's tokenizer and on a custom
template whose output is known exactly."""

from __future__ import annotations

import pytest

from attnserve.entrypoints.chat_utils import (
    ChatTemplateOptions,
    apply_chat_template,
    check_chat_template_options,
    load_chat_template,
)
from attnserve.refusals import Refused, openai_error

# every message as "<role>:<content>|", then "A:" for the generation prompt, and the variable "flag" when given
CUSTOM = (
    "{% for m in messages %}{{ m['role'] }}:{{ m['content'] }}|{% endfor %}"
    "{% if flag is defined %}[{{ flag }}]{% endif %}{% if add_generation_prompt %}A:{% endif %}"
)
CHAT = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}]


def test_custom_template_output_is_exact(default_tokenizer):
    render = lambda **kw: apply_chat_template(default_tokenizer, CHAT, ChatTemplateOptions(CUSTOM, **kw))  # noqa: E731
    assert render() == "user:Hi|assistant:Hel|A:"
    assert render(add_generation_prompt=False) == "user:Hi|assistant:Hel|"
    assert render(chat_template_kwargs={"flag": 7}) == "user:Hi|assistant:Hel|[7]A:"
    # the same name among the kwargs wins over the field (vLLM's serving_engine and LLM.chat update the fields'
    # dict with chat_template_kwargs last)
    assert render(chat_template_kwargs={"add_generation_prompt": False}) == "user:Hi|assistant:Hel|"
    assert render(add_generation_prompt=False, chat_template_kwargs={"add_generation_prompt": True}).endswith("A:")
    # the final message left open: the text ends with its content
    assert render(add_generation_prompt=False, continue_final_message=True) == "user:Hi|assistant:Hel"


def test_default_template_matches_transformers(default_tokenizer):
    tok = default_tokenizer
    for kw in (
        {"add_generation_prompt": True},
        {"add_generation_prompt": False},
        {"add_generation_prompt": False, "continue_final_message": True},
    ):
        ours = apply_chat_template(tok, CHAT, ChatTemplateOptions(**kw))
        assert ours == tok.apply_chat_template(CHAT, tokenize=False, **kw)
    opened = apply_chat_template(
        tok, CHAT, ChatTemplateOptions(add_generation_prompt=False, continue_final_message=True)
    )
    assert opened.endswith("<|im_start|>assistant\nHel")  # SmolLM2's ChatML, the last turn not closed
    # the same two inside chat_template_kwargs win over the fields (vLLM merges the kwargs last)
    kwargs = {"add_generation_prompt": False, "continue_final_message": True}
    assert apply_chat_template(tok, CHAT, ChatTemplateOptions(chat_template_kwargs=kwargs)) == opened
    closed = apply_chat_template(tok, CHAT, ChatTemplateOptions(chat_template_kwargs={"add_generation_prompt": False}))
    assert closed == tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=False)


@pytest.mark.parametrize(
    "options, param, value",
    [
        (ChatTemplateOptions(continue_final_message=True), "continue_final_message", "true"),
        (ChatTemplateOptions(chat_template_kwargs={"continue_final_message": True}), "continue_final_message", "true"),
        (ChatTemplateOptions(chat_template_kwargs={"tokenize": True}), "chat_template_kwargs.tokenize", "true"),
        (ChatTemplateOptions(chat_template_kwargs={"chat_template": "x"}), "chat_template_kwargs.chat_template", '"x"'),
    ],
)
def test_options_no_template_can_take_are_refused(options, param, value):
    with pytest.raises(Refused) as e:
        check_chat_template_options(options)
    message, where = openai_error(e.value.refusal)
    assert where == param and message.startswith(f"{param}: {value} not allowed")


def test_a_template_that_fails_is_refused_naming_it(default_tokenizer):
    with pytest.raises(Refused) as e:
        apply_chat_template(default_tokenizer, CHAT, ChatTemplateOptions("{% for %}"))
    assert e.value.path == ("chat_template",) and "TemplateSyntaxError" in str(e.value)
    raising = "{{ raise_exception('no assistant turns') }}"
    with pytest.raises(Refused) as e:
        apply_chat_template(default_tokenizer, CHAT, ChatTemplateOptions(raising))
    assert "no assistant turns" in str(e.value)


def test_no_template_at_all_is_refused():
    class NoTemplate:
        chat_template = None

    with pytest.raises(Refused) as e:
        apply_chat_template(NoTemplate(), CHAT, ChatTemplateOptions())
    assert e.value.path == ("chat_template",)


def test_load_chat_template_reads_a_file_or_takes_the_text(tmp_path):
    f = tmp_path / "t.jinja"
    f.write_text(CUSTOM)
    assert load_chat_template(str(f)) == CUSTOM
    assert load_chat_template(CUSTOM) == CUSTOM  # no such file, but a template
    assert load_chat_template(None) is None
    with pytest.raises(Refused) as e:  # no such file, and no template: a path mistyped
        load_chat_template(str(tmp_path / "missing.jinja"))
    assert e.value.path == ("chat_template",) and "cannot be read" in str(e.value)
