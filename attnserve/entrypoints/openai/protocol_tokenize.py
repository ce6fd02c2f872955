"""Pydantic request and response models of vLLM's ``/tokenize`` and ``/detokenize`` (``protocol.py``: the shared
pieces, and the rules every field follows).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from attnserve.entrypoints.openai.protocol import OpenAIModel
from attnserve.entrypoints.openai.protocol_chat import ChatMessage, ChatTool


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
    tools: list[ChatTool] | None = None  # given to the chat template, as /v1/chat/completions gives them
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
