"""Pydantic request and response models of the OpenAI API subset the server speaks.

Field names, defaults and shapes follow OpenAI's API reference (completions, chat completions, models,
errors); ``top_k``, ``min_p``, ``ignore_eos``, ``stop_token_ids``, ``skip_special_tokens``, ``repetition_penalty``,
``min_tokens``, ``bad_words``, ``allowed_token_ids``, ``prompt_logprobs``, ``include_stop_str_in_output``,
``spaces_between_special_tokens``, ``truncate_prompt_tokens``, the chat-template fields and /tokenize, /detokenize
are vLLM's extensions. A request field a model here does not declare is kept (``model_extra``) and judged by
``vllm_fields.check_extra_fields``: one of vLLM's is refused with a 400 unless its value changes nothing, any other
is ignored with a warning in the log (as vLLM does). Some declared fields ask for something attnserve cannot do and
are refused with a 400 too:
``response_format`` other than text and vLLM's ``guided_*`` / ``structured_outputs`` (structured output); on
chat, non-empty ``tools`` or ``functions``, ``tool_choice`` or ``function_call`` other than "none" (tool calling).
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


class ResponseFormat(OpenAIModel):
    """OpenAI's ``response_format``; only ``{"type": "text"}`` is supported (``json_schema`` etc. ignored)."""

    type: str


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
        return cls(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                   total_tokens=prompt_tokens + completion_tokens,
                   prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens))


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
    response_format: ResponseFormat | None = Field(None, description="only type 'text' is supported")
    # vLLM's structured-output extensions (``guided_*`` up to vLLM 0.10, then ``structured_outputs``): declared
    # so that a request using them is refused (``serving.check_unsupported``), not answered in free text
    guided_json: str | dict[str, Any] | None = Field(None, description="vLLM extension; not supported")
    guided_regex: str | None = Field(None, description="vLLM extension; not supported")
    guided_choice: list[str] | None = Field(None, description="vLLM extension; not supported")
    guided_grammar: str | None = Field(None, description="vLLM extension; not supported")
    structured_outputs: dict[str, Any] | None = Field(None, description="vLLM extension; not supported")
    user: str | None = None
    ignore_eos: bool = False
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = None
    skip_special_tokens: bool = True
    # vLLM's sampling extensions (core/sampling_params.py says what each does)
    repetition_penalty: float | None = Field(None, gt=0.0, description="vLLM extension; default 1.0 (off)")
    min_tokens: int = Field(0, ge=0, description="vLLM extension")
    bad_words: list[str] = Field(default_factory=list, description="vLLM extension")
    allowed_token_ids: list[Annotated[int, Field(ge=0)]] | None = Field(None, description="vLLM extension")
    prompt_logprobs: int | None = Field(None, ge=0, description="vLLM extension; not with stream; at most --max-logprobs")
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


# --- chat completions --------------------------------------------------------------------------------
class ContentPart(OpenAIModel):
    type: Literal["text"]
    text: str


class ChatMessage(OpenAIModel):
    """A message of the conversation. ``content`` is required whatever the role: an assistant message may
    omit it in OpenAI's API only when it carries tool calls, and attnserve has no tool calling. A list of parts
    holds one at least, as OpenAI's API refuses ``[]``."""

    role: Literal["system", "developer", "user", "assistant", "tool"]  # chat_utils.CHAT_ROLES
    content: str | Annotated[list[ContentPart], Field(min_length=1)]
    name: str | None = None


class ChatCompletionRequest(SamplingFields):
    """``POST /v1/chat/completions``. The prompt is the tokenizer's chat template over ``messages``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1, description="deprecated by OpenAI for max_completion_tokens")
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, description="at most the server's --max-logprobs")
    add_generation_prompt: bool = True
    # vLLM's chat-template extensions (chat_utils.ChatTemplateOptions)
    continue_final_message: bool = Field(False, description="vLLM extension: leave the last message open for the "
                                                            "model to continue (with add_generation_prompt false)")
    chat_template: str | None = Field(None, description="vLLM extension: a Jinja chat template for this request "
                                                        "(needs --trust-request-chat-template)")
    chat_template_kwargs: dict[str, Any] | None = Field(None, description="vLLM extension: more variables for the "
                                                                          "chat template")
    add_special_tokens: bool = Field(False, description="vLLM extension: the tokenizer adds its special tokens "
                                                        "(BOS) on top of the template's")
    echo: bool = Field(False, description="vLLM extension: the reply starts with the last message's content when "
                                          "that message is the assistant's")
    tools: list[dict[str, Any]] | None = Field(None, description="not supported: must be empty")
    functions: list[dict[str, Any]] | None = Field(None, description="deprecated by OpenAI for tools; must be empty")
    tool_choice: str | dict[str, Any] | None = Field(None, description="not supported: only 'none'")
    function_call: str | dict[str, Any] | None = Field(None, description="deprecated by OpenAI for tool_choice; "
                                                                        "only 'none'")


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatChoiceLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None = None


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatCompletionChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatChoiceLogprobs | None = None
    finish_reason: Literal["stop", "length", "abort"] | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionChoice]
    usage: UsageInfo
    system_fingerprint: str | None = None
    prompt_logprobs: PromptLogprobs | None = None  # vLLM extension


class ChatStreamChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: ChatChoiceLogprobs | None = None
    finish_reason: Literal["stop", "length", "abort"] | None = None
    stop_reason: int | str | None = None


class ChatCompletionStreamResponse(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatStreamChoice]
    usage: UsageInfo | None = None


# --- tokenize, detokenize (vLLM's) --------------------------------------------------------------------------
class TokenizeCompletionRequest(OpenAIModel):
    """``POST /tokenize`` with a prompt."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool | None = False


class TokenizeChatRequest(OpenAIModel):
    """``POST /tokenize`` with chat messages: the chat template's prompt, as /v1/chat/completions renders it."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool | None = False


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(OpenAIModel):
    """``POST /detokenize``."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    tokens: list[Annotated[int, Field(ge=0)]]


class DetokenizeResponse(BaseModel):
    prompt: str


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
