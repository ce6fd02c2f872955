"""LLM: the offline Python API (vLLM's ``LLM.generate`` / ``LLM.chat``)."""

from __future__ import annotations

from collections.abc import Sequence

from attnserve.config import EngineConfig, build_engine_config
from attnserve.engine.llm_engine import LLMEngine
from attnserve.engine.outputs import RequestOutput
from attnserve.engine.sampling_params import SamplingParams

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
        prompts: str | Sequence[str] | Sequence[list[int]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Generate for every prompt (text or token ids); outputs in prompt order.

        All prompts are validated and queued before the first step; a bad one raises before any work.
        """
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = sampling_params if sampling_params is not None else SamplingParams()
        params_list = list(params) if isinstance(params, Sequence) else [params] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError(f"{len(params_list)} sampling params for {len(prompts)} prompts")
        token_prompts = [self.engine.check_prompt(p) for p in prompts]  # all checked before any is queued
        ids = [self.engine.add_request(p, sp, prompt_token_ids=t) for p, t, sp in zip(prompts, token_prompts, params_list)]
        return self._run(ids, use_tqdm)

    def chat(
        self,
        messages: list[dict] | list[list[dict]],
        sampling_params: SamplingParams | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Apply the tokenizer's chat template to each conversation and generate the assistant's reply."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [
            self.tokenizer.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
            for conv in conversations
        ]
        token_prompts = [self.tokenizer.encode(p, add_special_tokens=False) for p in prompts]
        return self.generate(token_prompts, sampling_params, use_tqdm)

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
