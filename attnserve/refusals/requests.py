"""The words of a prompt or chat request refused by every surface alike (``LLM.generate``/``chat``, the server,
``attnserve generate``): an empty or too long prompt, a token id past the vocabulary, a chat message or template
that is not what it must be, a prompt of no known kind.

``engine/request_checks.py``, ``entrypoints/chat_utils.py`` and ``entrypoints/llm.py`` refuse with these.
"""

from __future__ import annotations

import json

from attnserve.refusals import Refusal, range_words

# ---------------------------------------------------------------- requests (engine/request_checks.py, chat_utils.py)

EMPTY_PROMPT = "a prompt of at least 1 token"
THE_PROMPT = "the prompt"
"""How a context-length refusal names the one prompt of a call (a batch's: by its place, ``prompts[1]``)."""


def params_per_prompt(given: int, prompts: int) -> str:
    """``LLM.generate`` given a list of SamplingParams that is not one per prompt."""
    return f"{given} sampling params for {prompts} prompts"


def not_sampling_params(path: tuple[str | int, ...], value: object, prompts: int) -> Refusal:
    """``LLM.generate``'s ``sampling_params`` (or an item of its list, ``("sampling_params", 1)``) that is no
    SamplingParams: a dict of its fields, say."""
    allowed = (
        "a SamplingParams" if len(path) > 1 else f"a SamplingParams, a list of {prompts} (one per prompt), or None"
    )
    return Refusal(path, value, allowed)


def prompt_too_long(num_prompt_tokens: int, max_model_len: int, prompt: str) -> Refusal:
    """A prompt that alone leaves no room for a generated token (OpenAI's wording, which names the context length,
    and which OpenAI clients look for), keyed to ``max_model_len``."""
    return Refusal(
        reason=f"This model's maximum context length is {max_model_len} tokens. However, {prompt} has "
        f"{num_prompt_tokens} tokens, which leaves no room for the completion (at most {max_model_len - 1} "
        "prompt tokens fit).",
        advice="Please raise {max_model_len} or reduce the length of the prompt.",
        key="max_model_len",
    )


def max_tokens_too_large(num_prompt_tokens: int, max_tokens: int, max_model_len: int, prompt: str) -> Refusal:
    """A prompt that fits, but not with ``max_tokens`` more (OpenAI's wording)."""
    return Refusal(
        reason=f"This model's maximum context length is {max_model_len} tokens. However, you requested "
        f"{num_prompt_tokens + max_tokens} tokens ({num_prompt_tokens} in {prompt}, {max_tokens} in the "
        "completion).",
        advice="Please reduce the length of the prompt or completion.",
    )


def token_id_words(vocab_size: int) -> str:
    """The allowed token ids in words: ``integer in [0, 49152), the vocabulary size``."""
    return f"{range_words('integer', ('>=', 0), ('<', vocab_size))}, the vocabulary size"


CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")  # protocol.ChatMessage.role's Literal
MESSAGES_WORDS = "a non-empty list of chat messages"
CONVERSATIONS_WORDS = f"{MESSAGES_WORDS}, or a list of such lists"
"""What ``LLM.chat`` takes: one conversation or a batch of them."""
TOOLS_WORDS = 'a list of tool definitions {"type": "function", "function": {...}}, or None'
"""What ``LLM.chat``'s ``tools`` takes."""
MESSAGE_WORDS = 'an object with "role" and "content", optionally "name", "tool_calls" and "tool_call_id"'
ROLE_WORDS = ", ".join(json.dumps(r) for r in CHAT_ROLES)
CONTENT_WORDS = 'a string, or a non-empty list of text parts {"type": "text", "text": string}'
TEXT_PART = 'a text part {"type": "text", "text": string}'
TEXT_PART_WORDS = 'an object with "type" and "text"'
TEXT_TYPE = '"text"'
A_LIST, A_CHAT_MESSAGE = "a list", "a chat message"
STRING, A_STRING = "string", "a string"
NAME_WORDS = "string, or None"
ONLY_ON_ASSISTANT = "only on an assistant message"
TOOL_CALL_WORDS = '{"id": string, "type": "function", "function": {"name": string, "arguments": JSON text}}'
JSON_TEXT = "JSON text"


# ---------------------------------------------------------------- LLM.generate's prompt dicts (entrypoints/llm.py)


PROMPT_KINDS = "text, a list of token ids, or a dict {'prompt': text} or {'prompt_token_ids': ids}"


def not_a_prompt(path: tuple[str | int, ...], value: object) -> Refusal:
    """``LLM.generate``'s prompt that is none of its kinds (None, bytes, a number)."""
    return Refusal(tuple(path), value, PROMPT_KINDS, noun="a prompt")


def prompt_dict_value(path: tuple[str | int, ...], key: str, value: object) -> Refusal:
    """A ``{"prompt": ...}`` or ``{"prompt_token_ids": ...}`` prompt whose value is of another kind."""
    return Refusal((*path, key), value, "a string" if key == "prompt" else "a list of token ids")


def prompt_dict_keys(path: tuple[str | int, ...], keys: list) -> Refusal:
    """A prompt dict with other keys than one of ``prompt``, ``prompt_token_ids``."""
    return Refusal(tuple(path), keys, "exactly one of the keys 'prompt', 'prompt_token_ids'")


# ---------------------------------------------------------------- chat templates (entrypoints/chat_utils.py)


def unreadable_template(path: tuple[str | int, ...], name: str, error: OSError) -> Refusal:
    """A ``--chat-template`` (request ``chat_template``) that names a file that cannot be read."""
    return Refusal(path, name, "a Jinja template file, or the template's text", reason=f"cannot be read ({error})")


CONTINUE_FINAL_MESSAGE = Refusal(
    ("continue_final_message",),
    True,
    "false while add_generation_prompt is true",
    advice="set add_generation_prompt false to continue the final message",
)
TEMPLATE_KWARGS_WORDS, A_MAPPING = "a mapping of template variables, or None", "a mapping"


def reserved_template_kwarg(name: str, value: object) -> Refusal:
    """``chat_template_kwargs`` naming ``chat_template`` or ``tokenize``: no template variables."""
    advice = "give the template as chat_template" if name == "chat_template" else ""
    return Refusal(("chat_template_kwargs", name), value, "absent", advice=advice)


NO_CHAT_TEMPLATE = Refusal(
    ("chat_template",),
    reason="is needed: this model's tokenizer has none",
    advice="give one (--chat-template, the request's chat_template), or send the prompt text as a completion",
)


def template_failed(given: bool, error: Exception) -> Refusal:
    """What a chat template raised, named by ``chat_template`` when the request (or flag) ``given`` it, else by
    ``messages``."""
    what = f"{type(error).__name__}: {error}"
    if given:
        return Refusal(("chat_template",), reason=f"failed on the messages ({what})")
    return Refusal(("messages",), reason=f"cannot be rendered by the chat template ({what})")
