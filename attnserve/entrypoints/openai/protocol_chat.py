"""Pydantic request and response models of chat completions (``/v1/chat/completions``), tools and tool calls
included (``protocol.py``: the shared pieces, and the rules every field follows).
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from attnserve.entrypoints.openai.protocol import NonEmptyStr, OpenAIModel, PromptLogprobs, SamplingFields, UsageInfo


class ContentPart(OpenAIModel):
    """A text part; other keys are kept (``model_extra``) to be named in the log's warning, as a request's own."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False, strict=True)
    type: Literal["text"]
    text: str


class ChatMessage(OpenAIModel):
    """A message of the conversation. ``content`` is required whatever the role, except that an assistant message
    with ``tool_calls`` may give it as null or leave it out (OpenAI's rule; chat_utils checks it). A list of parts
    holds one at least, as OpenAI's API refuses ``[]``. A tool's answer names its call by ``tool_call_id``. Other
    keys are kept (``model_extra``) to be named in the log's warning, as a request's own undeclared fields are."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False, strict=True)

    role: Literal["system", "developer", "user", "assistant", "tool"]  # chat_utils.CHAT_ROLES
    content: str | Annotated[list[ContentPart], Field(min_length=1)]
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _tool_calls_without_content(cls, data):
        """An assistant message with tool calls may go without content: it is "" (as vLLM renders it)."""
        if isinstance(data, dict) and data.get("tool_calls") and data.get("content") is None:
            return {**data, "content": ""}
        return data


class FunctionDefinition(OpenAIModel):
    name: NonEmptyStr
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema; None: no arguments
    strict: bool | None = None


class ChatTool(OpenAIModel):
    """One entry of ``tools``."""

    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(OpenAIModel):
    name: NonEmptyStr


class NamedToolChoice(OpenAIModel):
    """``tool_choice`` naming one function: the output is that function's arguments."""

    type: Literal["function"] = "function"
    function: NamedFunction


class ChatCompletionRequest(SamplingFields):
    """``POST /v1/chat/completions``. The prompt is the tokenizer's chat template over ``messages``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1, description="deprecated by OpenAI for max_completion_tokens")
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, description="at most the server's --max-logprobs")
    add_generation_prompt: bool = True
    # vLLM's chat-template extensions (chat_utils.ChatTemplateOptions)
    continue_final_message: bool = Field(
        False,
        description="vLLM extension: leave the last message open for the "
        "model to continue (with add_generation_prompt false)",
    )
    chat_template: str | None = Field(
        None, description="vLLM extension: a Jinja chat template for this request (needs --trust-request-chat-template)"
    )
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description="vLLM extension: more variables for the chat template"
    )
    add_special_tokens: bool = Field(
        False, description="vLLM extension: the tokenizer adds its special tokens (BOS) on top of the template's"
    )
    echo: bool = Field(
        False,
        description="vLLM extension: the reply starts with the last message's content when "
        "that message is the assistant's",
    )
    tools: list[ChatTool] | None = None
    functions: list[dict[str, Any]] | None = Field(None, description="deprecated by OpenAI for tools; must be empty")
    # None: "auto" when tools are given, else "none" (OpenAI's and vLLM's defaults)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    # false: at most one tool call (``required``: constrained to one; ``auto``: the first one parsed, as vLLM)
    parallel_tool_calls: bool | None = None
    function_call: str | dict[str, Any] | None = Field(
        None, description="deprecated by OpenAI for tool_choice; only 'none'"
    )


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatChoiceLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None = None


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class DeltaFunctionCall(BaseModel):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(BaseModel):
    """A streamed piece of a tool call: the first of each call has its ``id``, ``type`` and ``name``."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChatCompletionChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatChoiceLogprobs | None = None
    finish_reason: Literal["stop", "length", "abort", "tool_calls"] | None = None
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
    finish_reason: Literal["stop", "length", "abort", "tool_calls"] | None = None
    stop_reason: int | str | None = None


class ChatCompletionStreamResponse(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatStreamChoice]
    usage: UsageInfo | None = None
