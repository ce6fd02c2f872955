"""Request fields vLLM's server knows, and what attnserve does with the ones its request models do not declare.

The request models keep undeclared fields (``model_extra``). :func:`check_extra_fields` judges them:

- a field vLLM's request model has (the tables below, written from vLLM's ``CompletionRequest``,
  ``ChatCompletionRequest``, ``TokenizeCompletionRequest``, ``TokenizeChatRequest`` and ``DetokenizeRequest``, older
  names such as ``guided_json`` and ``best_of`` included) is refused with a 400 naming it, unless its value is one
  that changes nothing (its default: ``use_beam_search: false``, ``priority: 0``, ``null``);
- any other field is ignored, with one warning line in the log per request, as vLLM does.

The refused set is therefore (vLLM's names) minus (the fields the pydantic model declares): a field a request model
gains stops being refused without a change here.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from pydantic import BaseModel

from attnserve.refusals import Refused, json_value
from attnserve.refusals.serving import vllm_field

logger = logging.getLogger(__name__)

_NULL = (None,)
_FALSE = (None, False)
_TRUE = (None, True)

# vLLM's sampling fields that completions and chat completions share -> the values that change nothing
_SAMPLING: dict[str, tuple] = {
    "frequency_penalty": (None, 0),
    "presence_penalty": (None, 0),
    "logit_bias": (None, {}),
    "seed": _NULL,
    "n": (None, 1),
    "stop": (None, [], ""),
    "stream": _FALSE,
    "stream_options": _NULL,
    "temperature": _NULL,
    "top_p": _NULL,
    "user": None,  # None: any value (vLLM ignores it too)
    "use_beam_search": _FALSE,
    "top_k": _NULL,
    "min_p": _NULL,
    "repetition_penalty": (None, 1),
    "watermarking": _FALSE,
    "length_penalty": (None, 1),
    "early_stopping": _FALSE,
    "stop_token_ids": (None, []),
    "include_stop_str_in_output": _FALSE,
    "ignore_eos": _FALSE,
    "min_tokens": (None, 0),
    "skip_special_tokens": _TRUE,
    "spaces_between_special_tokens": _TRUE,
    "truncate_prompt_tokens": _NULL,
    "truncation_side": _NULL,
    "allowed_token_ids": _NULL,
    "prompt_logprobs": _NULL,
    "logprob_token_ids": _NULL,
    "bad_words": (None, []),
    "logits_processors": _NULL,
    "response_format": _NULL,
    "structured_outputs": _NULL,
    "guided_json": _NULL,
    "guided_regex": _NULL,
    "guided_choice": _NULL,
    "guided_grammar": _NULL,
    "structural_tag": _NULL,
    "guided_decoding_backend": _NULL,
    "guided_whitespace_pattern": _NULL,
    "priority": (None, 0),
    "request_id": _NULL,
    "session_id": _NULL,
    "return_tokens_as_token_ids": _FALSE,
    "return_token_ids": _FALSE,
    "routed_experts_prompt_start": (None, 0),
    "return_token_offsets": _FALSE,
    "return_mm_kwargs": _TRUE,
    "cache_salt": _NULL,
    "kv_transfer_params": _NULL,
    "ec_transfer_params": _NULL,
    "vllm_xargs": _NULL,
    "repetition_detection": _NULL,
    "thinking_token_budget": _NULL,
    "stream_interval": _NULL,
    "model": None,
}

COMPLETION_FIELDS: dict[str, tuple | None] = {
    **_SAMPLING,
    "prompt": None,
    "echo": _FALSE,
    "logprobs": _NULL,
    "max_tokens": None,
    "suffix": (None, ""),
    "best_of": _NULL,
    "prompt_embeds": _NULL,
    "add_special_tokens": _TRUE,
}

CHAT_FIELDS: dict[str, tuple | None] = {
    **_SAMPLING,
    "messages": None,
    "logprobs": _FALSE,
    "top_logprobs": (None, 0),
    "max_tokens": None,
    "max_completion_tokens": None,
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "reasoning_effort": _NULL,
    "include_reasoning": _TRUE,
    "best_of": _NULL,
    "echo": _FALSE,
    "add_generation_prompt": _TRUE,
    "continue_final_message": _FALSE,
    "add_special_tokens": _FALSE,
    "documents": _NULL,
    "chat_template": _NULL,
    "chat_template_kwargs": (None, {}),
    "media_io_kwargs": _NULL,
    "mm_processor_kwargs": _NULL,
    "return_prompt_text": _FALSE,
}

TOKENIZE_FIELDS: dict[str, tuple | None] = {
    "model": None,
    "prompt": None,
    "messages": None,
    "add_special_tokens": None,
    "return_token_strs": _FALSE,
    "add_generation_prompt": _TRUE,
    "continue_final_message": _FALSE,
    "chat_template": _NULL,
    "chat_template_kwargs": (None, {}),
    "media_io_kwargs": _NULL,
    "mm_processor_kwargs": _NULL,
}

DETOKENIZE_FIELDS: dict[str, tuple | None] = {"model": None, "tokens": None}


def _same(value, harmless: tuple) -> bool:
    """Whether ``value`` is one of ``harmless``, kind included (``0`` is not ``false``; ``1.0`` is ``1``)."""
    return any(value == h and isinstance(value, bool) == isinstance(h, bool) for h in harmless)


def check_extra_fields(req: BaseModel, known: Mapping[str, tuple | None]) -> None:
    """Judge the fields ``req`` got that its model does not declare (see the module docstring): raise Refused for the
    first one ``known`` (vLLM's fields) lists with a value that would change what runs (``use_beam_search true not
    allowed (allowed: false, or null); attnserve does not implement vLLM's use_beam_search``); log one warning
    naming the others, and the undeclared keys of chat messages and their content parts (``messages[0].foo``)."""
    extra = req.model_extra or {}
    unknown = _nested_extra(req)
    for name, value in extra.items():
        if name not in known:
            unknown.append(name)
        elif known[name] is not None and not _same(value, known[name]):
            words = [json_value(h) for h in known[name] if h is not None] + ["null"]
            allowed = ", ".join(words[:-1]) + ", or null" if len(words) > 1 else "null (absent)"
            raise Refused(vllm_field(name, value, allowed))
    if unknown:  # vLLM's words (OpenAIBaseModel.__log_extra_fields__)
        logger.warning("The following fields were present in the request but ignored: %s", set(unknown))


def _nested_extra(req: BaseModel) -> list[str]:
    """``messages[i].key`` and ``messages[i].content[j].key`` for each key a chat message or part got undeclared."""
    names = []
    for i, m in enumerate(getattr(req, "messages", None) or []):
        names += [f"messages[{i}].{k}" for k in m.model_extra or {}]
        if isinstance(m.content, list):
            for j, part in enumerate(m.content):
                names += [f"messages[{i}].content[{j}].{k}" for k in part.model_extra or {}]
    return names
