"""``POST /v1/completions``: prompts (text or token ids, one or many) -> completions, whole or streamed."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from attnserve.engine.outputs import CompletionOutput, RequestOutput
from attnserve.core.sampling_params import SamplingParams
from attnserve.entrypoints.openai.errors import OpenAIError
from attnserve.entrypoints.openai.limits import check_request_lists
from attnserve.entrypoints.openai.protocol import (
    CompletionChoice,
    CompletionLogProbs,
    CompletionRequest,
    CompletionResponse,
    CompletionStreamResponse,
    UsageInfo,
)
from attnserve.entrypoints.openai.vllm_fields import COMPLETION_FIELDS
from attnserve.entrypoints.openai.serving import (
    ServingContext,
    empty_prompt,
    generate_all,
    new_id,
    prompt_logprobs,
    sse_stream,
    until_disconnected,
)
from attnserve.entrypoints.openai.request_fields import (
    check_fields,
    check_stream_options,
    check_unsupported,
    sampling_params,
    truncate_prompt,
)
from attnserve.entrypoints.openai.structured_fields import structured_outputs
from attnserve.refusals import serving as words


@dataclass
class _Sent:
    """How much of one choice a stream has sent."""

    text: int = 0
    tokens: int = 0
    offset: int = 0  # text_offset of the next token
    finished: bool = False


async def create_completion(ctx: ServingContext, req: CompletionRequest, raw: Request) -> Response:
    arrival = time.monotonic()  # TTFT and latency count tokenizing too
    ctx.check_ready()
    model = ctx.check_model(req.model)
    check_request_lists(req)  # limits.py: before any tokenizing
    check_fields(req, COMPLETION_FIELDS)
    check_unsupported(req)
    check_stream_options(req)
    if req.suffix:
        raise OpenAIError(words.SUFFIX, 400, param="suffix")
    if req.best_of is not None and req.best_of != req.n:
        raise OpenAIError(words.best_of(req.best_of, req.n), 400, param="best_of")
    if req.echo and req.logprobs is not None:
        raise OpenAIError(words.ECHO_LOGPROBS, 400, param="echo")
    constraint = structured_outputs(req)
    # tokenizing (seconds for a long text) and compiling a grammar on the tokenizer thread, so that the event loop
    # answers other requests
    texts, token_prompts, params = (
        await ctx.tokenizer_thread.run(_prepare, ctx, req, constraint)
        if _needs_tokenizer(req) or constraint is not None
        else _prepare(ctx, req)
    )
    request_id = new_id("cmpl")
    outputs = generate_all(ctx, token_prompts, params, request_id, arrival)
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        chunks = _stream(req, model, request_id, texts, outputs, include_usage)
        return StreamingResponse(sse_stream(chunks), media_type="text/event-stream")
    connected, final = await until_disconnected(raw, _collect(outputs, len(token_prompts)))
    if not connected:
        return Response(status_code=499)  # nobody reads it; the requests were aborted
    choices, completion_tokens = [], 0
    for p, out in enumerate(final):
        for c in out.outputs:
            prefix = texts[p] if req.echo else ""
            logprobs = _logprobs(c, 0, len(c.token_ids), len(prefix)) if req.logprobs is not None else None
            choices.append(
                CompletionChoice(
                    index=p * req.n + c.index,
                    text=prefix + c.text,
                    logprobs=logprobs,
                    finish_reason=c.finish_reason,
                    stop_reason=c.stop_reason,
                    prompt_logprobs=prompt_logprobs(out),
                )
            )
            completion_tokens += len(c.token_ids)
    prompt_tokens = sum(len(ids) for ids in token_prompts)
    usage = UsageInfo.of(prompt_tokens, completion_tokens, sum(out.num_cached_tokens for out in final))
    body = CompletionResponse(id=request_id, model=model, choices=choices, usage=usage)
    return JSONResponse(body.model_dump(mode="json"))


def _needs_tokenizer(req: CompletionRequest) -> bool:
    """Whether preparing ``req`` calls the tokenizer: a text prompt to tokenize, or token ids to decode for echo."""
    prompt = req.prompt  # a string, or a list of one kind (the schema's union): its first item says which
    return bool(req.echo) or isinstance(prompt, str) or (bool(prompt) and isinstance(prompt[0], str))


def _prepare(
    ctx: ServingContext, req: CompletionRequest, constraint=None
) -> tuple[list[str] | None, list[list[int]], list[SamplingParams]]:
    """(prompt texts for echo, token-id prompts, their SamplingParams) of ``req``, each prompt checked against the
    context (``_prompts``, ``check_prompt``); 400 for the first bad one. Calls the tokenizer when
    ``_needs_tokenizer``: then it runs on the tokenizer thread."""
    texts, token_prompts, paths = _prompts(ctx, req.prompt, req.echo, req.add_special_tokens)
    token_prompts = [truncate_prompt(ctx, ids, req) for ids in token_prompts]
    params = [
        sampling_params(ctx, req, ctx.check_prompt(ids, req.max_tokens, path), req.logprobs, constraint=constraint)
        for ids, path in zip(token_prompts, paths)
    ]
    return texts, token_prompts, params


def _prompts(
    ctx: ServingContext,
    prompt,
    echo: bool,
    add_special_tokens: bool = True,
) -> tuple[list[str] | None, list[list[int]], list[tuple[str | int, ...]]]:
    """(prompt texts, token-id prompts, their paths: ``("prompt",)``, ``("prompt", 1)``) for each prompt of the
    request; the texts (token ids decoded) only for ``echo``, else None. An empty one (``""``, ``[]``,
    ``["a", ""]``) is a 400 naming its path and the value as sent (``empty_prompt``), checked before tokenizing:
    a tokenizer may turn ``""`` into a lone BOS token."""
    one = isinstance(prompt, str) or not prompt or isinstance(prompt[0], int)
    items = [(("prompt",), prompt)] if one else [(("prompt", i), p) for i, p in enumerate(prompt)]
    token_prompts = []
    for path, p in items:
        ids = (
            (ctx.tokenizer.encode(p, add_special_tokens=add_special_tokens) if p else [])
            if isinstance(p, str)
            else list(p)
        )
        if not ids:
            raise empty_prompt(path, p)
        ctx.check_token_ids(ids, path)  # out-of-vocabulary token ids before decoding them
        token_prompts.append(ids)
    paths = [path for path, _ in items]
    if not echo:
        return None, token_prompts, paths
    return [p if isinstance(p, str) else ctx.tokenizer.decode(p) for _, p in items], token_prompts, paths


async def _collect(outputs: AsyncIterator[tuple[int, RequestOutput]], num_prompts: int) -> list[RequestOutput]:
    final: list[RequestOutput | None] = [None] * num_prompts
    async for i, out in outputs:
        final[i] = out
    return final


async def _stream(
    req: CompletionRequest,
    model: str,
    request_id: str,
    texts: list[str] | None,
    outputs: AsyncIterator[tuple[int, RequestOutput]],
    include_usage: bool,
) -> AsyncIterator[dict]:
    sent: dict[int, _Sent] = {}
    prompt_tokens, completion_tokens = 0, 0
    cached: dict[int, int] = {}  # prompt -> its cached tokens
    async for p, out in outputs:
        cached[p] = out.num_cached_tokens
        choices = []
        for c in out.outputs:
            index = p * req.n + c.index
            if index not in sent:
                sent[index] = _Sent(offset=len(texts[p]) if req.echo else 0)
                prompt_tokens += len(out.prompt_token_ids) if c.index == 0 else 0
            s = sent[index]
            if s.finished or (len(c.token_ids) == s.tokens and c.finish_reason is None):
                continue
            text = c.text[s.text :]
            if req.echo and s.tokens == 0 and s.text == 0:
                text = texts[p] + text
            logprobs = _logprobs(c, s.tokens, len(c.token_ids), s.offset) if req.logprobs is not None else None
            if logprobs is not None and logprobs.tokens:
                s.offset = logprobs.text_offset[-1] + len(logprobs.tokens[-1])
            completion_tokens += len(c.token_ids) - s.tokens
            s.text, s.tokens, s.finished = len(c.text), len(c.token_ids), c.finish_reason is not None
            choices.append(
                CompletionChoice(
                    index=index, text=text, logprobs=logprobs, finish_reason=c.finish_reason, stop_reason=c.stop_reason
                )
            )
        if choices:
            yield _chunk(CompletionStreamResponse(id=request_id, model=model, choices=choices), include_usage)
    if include_usage:
        usage = UsageInfo.of(prompt_tokens, completion_tokens, sum(cached.values()))
        yield CompletionStreamResponse(id=request_id, model=model, choices=[], usage=usage).model_dump(mode="json")


def _chunk(chunk: CompletionStreamResponse, include_usage: bool) -> dict:
    d = chunk.model_dump(mode="json")
    if not include_usage:
        d.pop("usage")
    return d


def _logprobs(c: CompletionOutput, start: int, end: int, offset: int) -> CompletionLogProbs:
    """OpenAI's legacy logprobs for generated tokens [start, end); ``offset`` is the first token's text offset."""
    lp = CompletionLogProbs()
    for tid, entry in zip(c.token_ids[start:end], (c.logprobs or [])[start:end]):
        sampled = entry[tid]
        lp.tokens.append(sampled.decoded_token)
        lp.token_logprobs.append(sampled.logprob)
        top: dict[str, float] = {}
        for e in sorted(entry.values(), key=lambda e: e.rank):  # tokens that decode alike ("\ufffd"): the best rank's
            top.setdefault(e.decoded_token, e.logprob)
        lp.top_logprobs.append(top)
        lp.text_offset.append(offset)
        offset += len(sampled.decoded_token)
    return lp
