"""Pydantic request and response models of the OpenAI API subset the server speaks: the shared pieces (errors,
usage, the sampling fields), completions and models here; chat completions in ``protocol_chat.py``, vLLM's
/tokenize and /detokenize in ``protocol_tokenize.py``.

Field names, defaults and shapes follow OpenAI's API reference (completions, chat completions, models,
errors); ``top_k``, ``min_p``, ``ignore_eos``, ``stop_token_ids``, ``skip_special_tokens``, ``repetition_penalty``,
``min_tokens``, ``bad_words``, ``allowed_token_ids``, ``prompt_logprobs``, ``include_stop_str_in_output``,
``spaces_between_special_tokens``, ``truncate_prompt_tokens``, the chat-template fields and /tokenize, /detokenize
are vLLM's extensions, as are ``structured_outputs`` and the older ``guided_json``, ``guided_regex``,
``guided_choice`` and ``guided_grammar`` (structured outputs, like OpenAI's ``response_format``). A request field a
model here does not declare is kept (``model_extra``) and judged by ``vllm_fields.check_extra_fields``: one of
vLLM's is refused with a 400 unless its value changes nothing, any other is ignored with a warning in the log (as
vLLM does). Declared fields refused with a 400: on chat, non-empty ``functions`` or a ``function_call`` other than
"none" (OpenAI's deprecated forms of ``tools`` and ``tool_choice``).
Ranges are declared on the fields, so that they show in the OpenAPI schema and violations are 400s. Types are
strict, as OpenAI's API: a string is not a number (``"temperature": "0.5"``), a boolean is not an integer
(``"max_tokens": true``), a number with a fraction part is not an integer, even ``2.0`` (``"n": 2.0``); an
integer is a number (``"temperature": 1``).
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from attnserve.config.model import SEED_MAX, SEED_MIN, SEED_WORDS

# every seed's range, the engine's and SamplingParams' (OpenAI's API and vLLM take it too), in the same words
_SEED = dict(ge=SEED_MIN, le=SEED_MAX, json_schema_extra={"x-allowed": SEED_WORDS})
MAX_N = 128
NonEmptyStr = Annotated[str, Field(min_length=1)]


class OpenAIModel(BaseModel):
    """Request models: ignore unknown fields; reject NaN and infinity (JSON has neither); strict types (no
    string to number, boolean to integer or 2.0 to integer coercion)."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, strict=True)


# --- errors ------------------------------------------------------------------------------------------
class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``."""

    error: ErrorInfo


# --- shared pieces -----------------------------------------------------------------------------------
class StreamOptions(OpenAIModel):
    include_usage: bool | None = False
    # vLLM's: usage in every chunk; not implemented, so declared to be refused when true (request_fields)
    continuous_usage_stats: bool | None = False


class JsonSchemaFormat(OpenAIModel):
    """``response_format.json_schema``: the schema the output follows (``strict`` or not, it is enforced)."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, strict=True, populate_by_name=True)

    name: str = "response"
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema")  # None: any JSON
    strict: bool | None = None


class ResponseFormat(OpenAIModel):
    """OpenAI's ``response_format``: ``text``, ``json_object`` (any JSON object) or ``json_schema``."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> UsageInfo:
        """Counts with their total and OpenAI's ``prompt_tokens_details.cached_tokens``."""
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
        )


class SamplingFields(OpenAIModel):
    """The sampling and stopping fields that completions and chat completions share. Fields it does not declare are
    kept (``model_extra``) for ``vllm_fields.check_extra_fields``: a vLLM field attnserve does not implement is
    refused, any other is ignored with a warning."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None  # None or "" = the served model
    n: int = Field(1, ge=1, le=MAX_N)
    temperature: float | None = Field(None, ge=0.0, description="0 = greedy; default 1.0")
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1, description="vLLM extension; 0 or -1 = all tokens")
    min_p: float | None = Field(None, ge=0.0, le=1.0, description="vLLM extension")
    seed: int | None = Field(None, **_SEED)
    stop: NonEmptyStr | list[NonEmptyStr] | None = None  # "" would stop before the first token
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(0.0, ge=-2.0, le=2.0)
    # token id (a decimal string) -> bias added to its logit, clamped to [-100, 100] (as OpenAI and vLLM)
    logit_bias: dict[str, float] | None = None
    response_format: ResponseFormat | None = None
    # vLLM's structured-output extensions (``guided_*`` up to vLLM 0.10, then ``structured_outputs``): at most one
    # of them and response_format (structured_fields.structured_outputs)
    structured_outputs: dict[str, Any] | None = Field(
        None, description="vLLM extension: json, regex, choice, grammar, json_object, disable_any_whitespace"
    )
    guided_json: str | dict[str, Any] | None = Field(None, description="vLLM extension (older)")
    guided_regex: str | None = Field(None, description="vLLM extension (older)")
    guided_choice: list[str] | None = Field(None, description="vLLM extension (older)")
    guided_grammar: str | None = Field(None, description="vLLM extension (older)")
    guided_decoding_backend: str | None = Field(None, description="vLLM extension (older): only 'xgrammar' or 'auto'")
    guided_whitespace_pattern: str | None = Field(None, description="vLLM extension (older): not supported")
    user: str | None = None
    ignore_eos: bool = False
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = None
    skip_special_tokens: bool = True
    # vLLM's sampling extensions (core/sampling_params.py says what each does)
    repetition_penalty: float | None = Field(None, gt=0.0, description="vLLM extension; default 1.0 (off)")
    min_tokens: int = Field(0, ge=0, description="vLLM extension")
    bad_words: list[str] = Field(default_factory=list, description="vLLM extension")
    allowed_token_ids: list[Annotated[int, Field(ge=0)]] | None = Field(None, description="vLLM extension")
    prompt_logprobs: int | None = Field(
        None, ge=0, description="vLLM extension; not with stream; at most --max-logprobs"
    )
    include_stop_str_in_output: bool = False
    spaces_between_special_tokens: bool = True
    truncate_prompt_tokens: int | None = Field(None, ge=-1, description="vLLM extension; -1 = max_model_len")


# --- completions -------------------------------------------------------------------------------------
class CompletionRequest(SamplingFields):
    """``POST /v1/completions``."""

    prompt: str | list[str] | list[Annotated[int, Field(ge=0)]] | list[list[Annotated[int, Field(ge=0)]]]
    max_tokens: int | None = Field(16, ge=1, description="None = up to the context length")
    add_special_tokens: bool = Field(True, description="vLLM extension: the tokenizer adds its special tokens (BOS)")
    echo: bool | None = False
    logprobs: int | None = Field(None, ge=0, description="at most the server's --max-logprobs")
    best_of: int | None = Field(None, ge=1, le=MAX_N, description="must equal n when given")
    suffix: str | None = Field(None, description="not supported: must be empty")


class CompletionLogProbs(BaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class PromptLogprob(BaseModel):
    """vLLM's ``Logprob`` of a prompt token: its logprob, rank (1 = most likely) and text."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# vLLM's prompt_logprobs: None for the first prompt token, then {token id: PromptLogprob} per token
PromptLogprobs = list[dict[int, PromptLogprob] | None]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: Literal["stop", "length", "abort"] | None = None
    stop_reason: int | str | None = None  # vLLM extension: the stop string or token id
    prompt_logprobs: PromptLogprobs | None = None  # vLLM extension


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo
    system_fingerprint: str | None = None


class CompletionStreamResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


# --- models, version ---------------------------------------------------------------------------------
class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "attnserve"
    root: str | None = None
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class VersionResponse(BaseModel):
    version: str
