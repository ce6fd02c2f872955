"""``POST /tokenize`` and ``POST /detokenize`` (vLLM's endpoints, request and response shapes).

/tokenize takes a prompt (``{"prompt": text, "add_special_tokens": true}``) or chat messages (``{"messages": [...],
"add_generation_prompt": true, ...}``: the prompt /v1/chat/completions would render, with the same template options
and checks) and answers ``{"count", "max_model_len", "tokens", "token_strs"}`` (``token_strs`` with
``return_token_strs``). /detokenize takes ``{"tokens": [...]}`` and answers ``{"prompt": text}``. A body with
``messages`` is a chat request, else a prompt request (vLLM's union tries the prompt first; a body with both is
refused here rather than read as one of them).
"""

from __future__ import annotations

import json

from fastapi import Request
from pydantic import BaseModel, TypeAdapter, ValidationError

from attnserve.entrypoints.openai.errors import OpenAIError, body_message, json_error_message, validation_message
from attnserve.entrypoints.openai.protocol_tokenize import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    TokenizeResponse,
)
from attnserve.entrypoints.openai.serving import ServingContext
from attnserve.entrypoints.openai.request_fields import check_fields
from attnserve.entrypoints.openai.serving_chat import render_chat, template_options
from attnserve.entrypoints.openai.vllm_fields import DETOKENIZE_FIELDS, TOKENIZE_FIELDS
from attnserve.refusals import serving as words


def inline_schema(annotation) -> dict:
    """The JSON schema of ``annotation`` with its ``$defs`` inlined (no recursion among them): a request body schema
    for routes that read their body themselves (``openapi_extra``), shown in /docs and fuzzed like the others."""
    schema = TypeAdapter(annotation).json_schema()
    defs = schema.pop("$defs", {})

    def resolve(node):
        if isinstance(node, dict):
            if "$ref" in node:
                return resolve(defs[node["$ref"].rsplit("/", 1)[-1]])
            return {k: resolve(v) for k, v in node.items()}
        return [resolve(v) for v in node] if isinstance(node, list) else node

    return resolve(schema)


def body_schema(annotation) -> dict:
    """``openapi_extra`` declaring a required JSON body of ``annotation``."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": inline_schema(annotation)}}}}


TOKENIZE_BODY = body_schema(TokenizeCompletionRequest | TokenizeChatRequest)
DETOKENIZE_BODY = body_schema(DetokenizeRequest)


def tokenize_model(body) -> type[BaseModel]:
    """The request model of a /tokenize body: the chat request when it has ``messages``."""
    return TokenizeChatRequest if isinstance(body, dict) and "messages" in body else TokenizeCompletionRequest


async def read_body(raw: Request):
    """The request's JSON body (``body.parse_body``); 400 for one that is no JSON object, in the words the other
    routes use."""
    try:
        body = await raw.json()
    except json.JSONDecodeError as e:
        raise OpenAIError(json_error_message(e.msg, e.pos, e.doc), 400) from None
    if not isinstance(body, dict):
        raise OpenAIError(
            body_message({"loc": ("body",), "input": body, "type": "model_type"}, raw.headers.get("content-type"))
            or words.BODY_NOT_OBJECT,
            400,
        )
    return body


def parse(model: type[BaseModel], body: dict) -> BaseModel:
    """``body`` validated as ``model``; 400 naming the first bad field, as the other routes' (``validation_message``)."""
    try:
        return model.model_validate(body)
    except ValidationError as e:
        message, param = validation_message(e.errors(), model)
        raise OpenAIError(message, 400, param=param) from None


async def tokenize(ctx: ServingContext, raw: Request) -> TokenizeResponse:
    body = await read_body(raw)
    req = parse(tokenize_model(body), body)
    ctx.check_ready()
    ctx.check_model(req.model)
    check_fields(req, TOKENIZE_FIELDS)
    if isinstance(req, TokenizeChatRequest):
        if "prompt" in (req.model_extra or {}):
            raise OpenAIError(words.TOKENIZE_PROMPT_AND_MESSAGES, 400, param="prompt")
        options = template_options(ctx, req)
        tokens = await ctx.tokenizer_thread.run(render_chat, ctx, req, options)
    else:
        tokens = await ctx.tokenizer_thread.run(
            lambda: ctx.tokenizer.encode(req.prompt, add_special_tokens=req.add_special_tokens)
        )
    strs = ctx.tokenizer.convert_ids_to_tokens(tokens) if req.return_token_strs else None
    return TokenizeResponse(count=len(tokens), max_model_len=ctx.max_model_len, tokens=tokens, token_strs=strs)


async def detokenize(ctx: ServingContext, raw: Request) -> DetokenizeResponse:
    req = parse(DetokenizeRequest, await read_body(raw))
    ctx.check_ready()
    ctx.check_model(req.model)
    check_fields(req, DETOKENIZE_FIELDS)
    if req.tokens:  # [] decodes to ""
        ctx.check_token_ids(req.tokens, ("tokens",))
    text = await ctx.tokenizer_thread.run(ctx.tokenizer.decode, req.tokens)
    return DetokenizeResponse(prompt=text)
