"""LLM: the offline Python API (vLLM's ``LLM.generate`` / ``LLM.chat``)."""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any

from attnserve.config import EngineConfig, build_engine_config
from attnserve.engine.llm_engine import LLMEngine
from attnserve.engine.outputs import RequestOutput
from attnserve.engine.request_checks import RequestValueError
from attnserve.core.sampling_params import SamplingParams
from attnserve.entrypoints.chat_utils import (
    ChatTemplateOptions,
    apply_chat_template,
    chat_messages,
    check_chat_template_options,
    is_list,
)
from attnserve.refusals import Refusal, Refused
from attnserve.refusals.requests import (
    A_LIST,
    CONVERSATIONS_WORDS,
    TOOLS_WORDS,
    not_a_prompt,
    not_sampling_params,
    params_per_prompt,
    prompt_dict_keys,
    prompt_dict_value,
)

PromptType = str | list[int] | dict  # text, token ids, or vLLM's {"prompt": str} / {"prompt_token_ids": list[int]}


def _token_ids(ids: Sequence) -> list:
    """``ids`` as a list, its integers (numpy's too) as plain ints; anything else is left for check_prompt to
    refuse by its position (a bool, a float, None)."""
    ids = list(ids)
    if set(map(type, ids)) - {int}:
        ids = [int(t) if isinstance(t, numbers.Integral) and not isinstance(t, bool) else t for t in ids]
    return ids


def parse_prompt(prompt: PromptType, path: tuple[str | int, ...] = ("prompt",)) -> str | list[int]:
    """One prompt as text or token ids: vLLM's TextPrompt / TokensPrompt dicts are unwrapped, token ids made
    plain ints.

    Raises Refused (a ValueError) at ``path`` for anything else: a dict with other keys (or both), a
    value of the wrong type (None, bytes, a number).
    """
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, Sequence) and not isinstance(prompt, (bytes, bytearray)):
        return _token_ids(prompt)  # check_prompt validates the ids
    if not isinstance(prompt, Mapping):
        raise Refused(not_a_prompt(path, prompt))
    keys = sorted(prompt, key=str)
    if keys == ["prompt"] and isinstance(prompt["prompt"], str):
        return prompt["prompt"]
    if (
        keys == ["prompt_token_ids"]
        and isinstance(prompt["prompt_token_ids"], Sequence)
        and not isinstance(prompt["prompt_token_ids"], (str, bytes, bytearray))
    ):
        return _token_ids(prompt["prompt_token_ids"])
    if keys in (["prompt"], ["prompt_token_ids"]):
        (key,) = keys
        raise Refused(prompt_dict_value(path, key, prompt[key]))
    raise Refused(prompt_dict_keys(path, keys))


def _is_single_prompt(prompts) -> bool:
    """Whether ``prompts`` is one prompt (text, a dict, token ids, or something no prompt is, which
    :func:`parse_prompt` then refuses) rather than a list of them."""
    if not isinstance(prompts, Sequence) or isinstance(prompts, (str, bytes, bytearray)):
        return True
    return bool(prompts) and isinstance(prompts[0], numbers.Integral)  # one prompt of token ids


class LLM:
    """An engine over one model for offline batched generation.

    ``LLM()`` loads the default model (SmolLM2-135M-Instruct). Engine arguments are the flag names with
    underscores: ``LLM("path", dtype="float32", block_size=16, attention_backend="CPU_ATTN")``.
    Raises ConfigError for a bad argument, ModelNotFoundError for a missing model.
    """

    def __init__(self, model: str | None = None, *, config: EngineConfig | None = None, **kwargs) -> None:
        config = config or build_engine_config(model, **kwargs)
        self.engine = LLMEngine(config)
        self.tokenizer = self.engine.tokenizer

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Generate for every prompt; outputs in prompt order.

        A prompt is text, a list of token ids, or vLLM's ``{"prompt": text}`` / ``{"prompt_token_ids": ids}``;
        one prompt or a list of them (mixed kinds allowed). ``RequestOutput.prompt`` is the text of a text
        prompt and None for token ids. All prompts are validated and queued before the first step; a bad
        one raises before any work, with the server's checks and words (``engine/request_checks.py``), naming the
        prompt as ``prompt`` (one) or ``prompts[1]`` (a batch's second):

        - an empty prompt: RequestValueError (a ValueError) ``prompt '' not allowed (allowed: a prompt of at
          least 1 token)``;
        - a token id outside the vocabulary, by its position: ``prompts[1][2] 50000 not allowed (allowed: integer
          in [0, 49152), the vocabulary size)``;
        - a prompt of max_model_len tokens or more: PromptTooLongError (a ValueError), and a prompt whose tokens
          plus ``max_tokens`` exceed max_model_len: MaxTokensTooLargeError (a ValueError), both in OpenAI's words
          (``This model's maximum context length is 2048 tokens. However, you requested ...``), as the server
          refuses them. ``max_tokens=None`` asks for the rest of the context.
        """
        single = _is_single_prompt(prompts)
        prompts = [prompts] if single else list(prompts)
        paths = [("prompt",)] if single else [("prompts", i) for i in range(len(prompts))]
        prompts = [parse_prompt(p, path) for p, path in zip(prompts, paths)]
        params = _params_list(sampling_params, len(prompts), self.engine.default_sampling_params())
        # all checked before any is queued (truncate_prompt_tokens applied first, as vLLM does)
        token_prompts = [
            self.engine.check_prompt(p, path, sp.truncate_prompt_tokens) for p, path, sp in zip(prompts, paths, params)
        ]
        return self._generate(prompts, token_prompts, paths, params, use_tqdm)

    def chat(
        self,
        messages: list[dict] | list[list[dict]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template_kwargs: dict[str, Any] | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[RequestOutput]:
        """Apply the chat template to each conversation and generate the assistant's reply (vLLM's ``LLM.chat``).

        ``chat_template``: the template's text (None: the tokenizer's); ``add_generation_prompt``: end with the
        assistant's header, so that the model answers; ``continue_final_message``: leave the last message open for the
        model to continue (``add_generation_prompt=False`` with it; both true is refused, as in vLLM);
        ``chat_template_kwargs``: more variables for the template (``{"enable_thinking": False}`` for Qwen3); ``tools``:
        function definitions (OpenAI's ``{"type": "function", "function": {...}}``) the template renders, as the
        server's ``tools`` (the output is text: no tool-call parsing, no constraint). A template
        that fails, or none at all, raises Refused (a ValueError) naming ``chat_template`` or ``messages``.

        ``messages`` is one conversation (a list of ``{"role", "content"}`` dicts) or a list of them. They are
        checked as the server checks them, in its words (:func:`chat_messages`): a bad one raises RequestValueError
        (a ValueError) naming its place, ``messages[0].content`` (one conversation) or ``messages[1][0].content``
        (a batch's second), the value and what is allowed; ``LLM.chat("hi")`` reads ``messages 'hi' is not a
        list (allowed: a non-empty list of chat messages, or a list of such lists)``. The rendered prompt is
        checked as :meth:`generate` checks a prompt (its length with ``max_tokens`` included).
        ``RequestOutput.prompt`` is the rendered prompt text.
        """
        if not is_list(messages) or not messages:
            raise RequestValueError(
                ("messages",),
                messages,
                CONVERSATIONS_WORDS,
                noun=None if is_list(messages) else A_LIST,
            )
        single = not is_list(messages[0])  # a message (or a mistake chat_messages names) first: one conversation
        conversations = [messages] if single else messages
        paths = [("messages",)] if single else [("messages", i) for i in range(len(conversations))]
        options = ChatTemplateOptions(
            chat_template, add_generation_prompt, continue_final_message, chat_template_kwargs
        )
        check_chat_template_options(options)  # before any message: the options' own mistakes first
        if tools is not None and not (is_list(tools) and all(isinstance(t, Mapping) for t in tools)):
            raise Refused(Refusal(("tools",), tools, TOOLS_WORDS))
        prompts = [
            apply_chat_template(self.tokenizer, chat_messages(conv, path), options, tools=tools)
            for conv, path in zip(conversations, paths)
        ]
        # the template already holds the special tokens (BOS, ...); all checked before any is queued
        params = _params_list(sampling_params, len(prompts), self.engine.default_sampling_params())
        token_prompts = [
            self.engine.check_prompt(
                self.tokenizer.encode(p, add_special_tokens=False), path, sp.truncate_prompt_tokens
            )
            for p, path, sp in zip(prompts, paths, params)
        ]
        return self._generate(prompts, token_prompts, paths, params, use_tqdm)

    def _generate(
        self,
        prompts: list[str | list[int]],
        token_prompts: list[list[int]],
        paths: list[tuple[str | int, ...]],
        params_list: list[SamplingParams],
        use_tqdm: bool,
    ) -> list[RequestOutput]:
        """Queue checked prompts (``prompts``: the text, or token ids, that outputs report; ``paths``: their names
        in errors) and run them. Each prompt's length with its ``max_tokens`` is checked before any is queued."""
        for t, sp, path in zip(token_prompts, params_list, paths):  # all checked before any is queued
            self.engine.check_params(sp)
            self.engine.check_max_tokens(len(t), sp, path)
        ids = [  # only finished outputs are read (_run): none is built for the steps before
            self.engine.add_request(p, sp, prompt_token_ids=t, final_only=True)
            for p, t, sp in zip(prompts, token_prompts, params_list)
        ]
        return self._run(ids, use_tqdm)

    def _run(self, ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        final: dict[str, RequestOutput] = {}
        bar = None
        if use_tqdm:
            from tqdm import tqdm

            bar = tqdm(total=len(ids), desc="Processed prompts", unit="req")
        try:
            while self.engine.has_unfinished_requests():
                for out in self.engine.step():
                    if out.finished:
                        final[out.request_id] = out
                        if bar is not None:
                            bar.update(1)
        except BaseException:
            # a step that raises (or ^C) must not leave this call's requests queued for the next call
            for request_id in ids:
                if request_id not in final:
                    self.engine.abort_request(request_id)
            raise
        finally:
            if bar is not None:
                bar.close()
        return [final[i] for i in ids]

    def get_tokenizer(self):
        """The tokenizer prompts are encoded with (vLLM's ``LLM.get_tokenizer``)."""
        return self.tokenizer

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prompt prefix, so that later prompts are computed anew (vLLM's
        ``LLM.reset_prefix_cache``; between calls no request holds a block). Returns True."""
        self.engine.reset_prefix_cache()
        return True


def _params_list(
    sampling_params: SamplingParams | Sequence[SamplingParams] | None, n: int, default: SamplingParams
) -> list[SamplingParams]:
    """One SamplingParams per prompt (one for all, or a list as long as the prompts; none given: ``default``, the
    generation config's defaults (--generation-config), as vLLM's LLM does); Refused (a ValueError) otherwise: a
    list of another length, or an item that is no SamplingParams (a dict of its fields too), named by its index.
    Each is a :meth:`SamplingParams.snapshot`: fields changed since construction are checked before any prompt is
    queued."""
    params = sampling_params if sampling_params is not None else default
    if isinstance(params, Sequence) and not isinstance(params, (str, bytes)):
        params_list = list(params)
        if len(params_list) != n:
            raise ValueError(params_per_prompt(len(params_list), n))
        bad = next((i for i, p in enumerate(params_list) if not isinstance(p, SamplingParams)), None)
        if bad is not None:
            raise Refused(not_sampling_params(("sampling_params", bad), params_list[bad], n))
        return [p.snapshot() for p in params_list]
    if not isinstance(params, SamplingParams):
        raise Refused(not_sampling_params(("sampling_params",), params, n))
    return [params.snapshot()] * n
