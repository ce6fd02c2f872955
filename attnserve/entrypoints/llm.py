"""LLM: the offline Python API (vLLM's ``LLM.generate`` / ``LLM.chat``)."""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence

from attnserve.config import EngineConfig, build_engine_config
from attnserve.engine.llm_engine import LLMEngine
from attnserve.engine.outputs import RequestOutput
from attnserve.engine.sampling_params import SamplingParams
from attnserve.entrypoints.chat_utils import chat_messages

PromptType = str | list[int] | dict  # text, token ids, or vLLM's {"prompt": str} / {"prompt_token_ids": list[int]}


def parse_prompt(prompt: PromptType) -> str | list[int]:
    """One prompt as text or token ids: vLLM's TextPrompt / TokensPrompt dicts are unwrapped.

    Raises ValueError for a dict with other keys (or both), or a value of the wrong type.
    """
    if not isinstance(prompt, Mapping):
        return prompt  # text or token ids; check_prompt validates the ids
    keys = sorted(prompt, key=str)
    if keys == ["prompt"] and isinstance(prompt["prompt"], str):
        return prompt["prompt"]
    if keys == ["prompt_token_ids"] and isinstance(prompt["prompt_token_ids"], Sequence) \
            and not isinstance(prompt["prompt_token_ids"], str):
        return list(prompt["prompt_token_ids"])
    if keys in (["prompt"], ["prompt_token_ids"]):
        (key,) = keys
        raise ValueError(f"prompt dict {key!r} value {prompt[key]!r} not allowed (allowed: "
                         f"{'a string' if key == 'prompt' else 'a list of token ids'})")
    raise ValueError(f"prompt dict with keys {keys} not allowed (allowed: exactly one of "
                     "{'prompt': str} or {'prompt_token_ids': list[int]})")


def _is_single_prompt(prompts) -> bool:
    if isinstance(prompts, (str, Mapping)):
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
        one raises before any work.
        """
        prompts = [parse_prompt(p) for p in ([prompts] if _is_single_prompt(prompts) else prompts)]
        token_prompts = [self.engine.check_prompt(p) for p in prompts]  # all checked before any is queued
        return self._generate(prompts, token_prompts, sampling_params, use_tqdm)

    def chat(
        self,
        messages: list[dict] | list[list[dict]],
        sampling_params: SamplingParams | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Apply the tokenizer's chat template to each conversation and generate the assistant's reply.

        Messages are checked as the server checks them (:func:`chat_messages`: every message needs a role and
        content); a bad one raises ValueError naming the conversation and the field (``messages[0].content``).
        ``RequestOutput.prompt`` is the rendered prompt text.
        """
        single = bool(messages) and isinstance(messages[0], Mapping)
        conversations = [messages] if single else messages
        prompts = []
        for i, conv in enumerate(conversations):
            try:
                checked = chat_messages(conv)
            except ValueError as e:
                raise ValueError(str(e) if single else f"conversation {i}: {e}") from None
            prompts.append(self.tokenizer.apply_chat_template(checked, tokenize=False, add_generation_prompt=True))
        # the template already holds the special tokens (BOS, ...); all checked before any is queued
        token_prompts = [self.engine.check_prompt(self.tokenizer.encode(p, add_special_tokens=False)) for p in prompts]
        return self._generate(prompts, token_prompts, sampling_params, use_tqdm)

    def _generate(self, prompts: list[str | list[int]], token_prompts: list[list[int]],
                  sampling_params: SamplingParams | Sequence[SamplingParams] | None,
                  use_tqdm: bool) -> list[RequestOutput]:
        """Queue checked prompts (``prompts``: the text, or token ids, that outputs report) and run them."""
        params = sampling_params if sampling_params is not None else SamplingParams()
        params_list = list(params) if isinstance(params, Sequence) else [params] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError(f"{len(params_list)} sampling params for {len(prompts)} prompts")
        for sp in params_list:  # all checked before any is queued
            self.engine.check_params(sp)
        ids = [self.engine.add_request(p, sp, prompt_token_ids=t) for p, t, sp in zip(prompts, token_prompts, params_list)]
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
