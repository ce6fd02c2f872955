"""``POST /v1/chat/completions``: messages -> the tokenizer's chat template -> the assistant's reply."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from attnserve.engine.outputs import CompletionOutput, RequestOutput
from attnserve.core.sampling_params import SamplingParams
from attnserve.entrypoints.chat_utils import (
    ChatTemplateOptions,
    apply_chat_template,
    chat_messages,
    check_chat_template_options,
)
from attnserve.entrypoints.openai.limits import check_request_lists
from attnserve.entrypoints.openai.protocol import UsageInfo
from attnserve.entrypoints.openai.protocol_chat import (
    ChatChoiceLogprobs,
    ChatCompletionChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionStreamResponse,
    ChatDelta,
    ChatResponseMessage,
    ChatStreamChoice,
    ChatTokenLogprob,
    TopLogprob,
)
from attnserve.engine.request_checks import RequestValueError
from attnserve.entrypoints.openai.vllm_fields import CHAT_FIELDS
from attnserve.refusals import Refusal, Refused
from attnserve.refusals.serving import (
    NEEDS_LOGPROBS,
    constrained_twice,
    deprecated_function_call,
    deprecated_functions,
    untrusted_chat_template,
)
from attnserve.entrypoints.openai.serving import (
    ServingContext,
    prompt_logprobs,
    refused,
    refusal_error,
    request_error,
    generate_all,
    new_id,
    sse_stream,
    until_disconnected,
)
from attnserve.entrypoints.openai.request_fields import (
    check_fields,
    truncate_prompt,
    check_stream_options,
    check_unsupported,
    sampling_params,
)
from attnserve.entrypoints.openai.structured_fields import structured_outputs
from attnserve.entrypoints.openai.tools import ToolMode, ToolStream, tool_constraint, tool_mode, tool_reply


async def create_chat_completion(ctx: ServingContext, req: ChatCompletionRequest, raw: Request) -> Response:
    arrival = time.monotonic()  # TTFT and latency count tokenizing too
    ctx.check_ready()
    model = ctx.check_model(req.model)
    check_request_lists(req)  # limits.py: before any tokenizing
    check_fields(req, CHAT_FIELDS)
    check_unsupported(req)
    check_no_functions(req)
    check_stream_options(req)
    options = template_options(ctx, req)
    if req.top_logprobs is not None and not req.logprobs:
        raise refusal_error(Refusal(("top_logprobs",), req.top_logprobs, reason=NEEDS_LOGPROBS))
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    mode = tool_mode(req, ctx.enable_auto_tool_choice, ctx.tool_parser)
    constraint, tools_constraint = structured_outputs(req), tool_constraint(req, mode)
    if constraint is not None and tools_constraint is not None:
        choice = req.tool_choice if isinstance(req.tool_choice, str) else "naming a function"
        raise refusal_error(constrained_twice(constraint[0], choice))
    # the template, tokenizing (seconds for a long conversation) and compiling a grammar on the tokenizer thread
    prompt_ids, params = await ctx.tokenizer_thread.run(
        _prepare, ctx, req, options, logprobs, constraint or tools_constraint, mode
    )
    echo = _echo(req)
    request_id = new_id("chatcmpl")
    outputs = generate_all(ctx, [prompt_ids], [params], request_id, arrival)
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        chunks = _stream(req, model, request_id, outputs, include_usage, mode, echo)
        return StreamingResponse(sse_stream(chunks), media_type="text/event-stream")
    connected, final = await until_disconnected(raw, _last(outputs))
    if not connected:
        return Response(status_code=499)
    choices = []
    for c in final.outputs:
        content, calls, finish_reason = tool_reply(mode, c.text, c.finish_reason)
        choices.append(
            ChatCompletionChoice(
                index=c.index,
                message=ChatResponseMessage(
                    content=echo + content if content is not None else content, tool_calls=calls
                ),
                logprobs=_logprobs(c, 0, len(c.token_ids), req.top_logprobs or 0) if req.logprobs else None,
                finish_reason=finish_reason,
                stop_reason=c.stop_reason,
            )
        )
    completion_tokens = sum(len(c.token_ids) for c in final.outputs)
    usage = UsageInfo.of(len(prompt_ids), completion_tokens, final.num_cached_tokens)
    body = ChatCompletionResponse(
        id=request_id, model=model, choices=choices, usage=usage, prompt_logprobs=prompt_logprobs(final)
    )
    return JSONResponse(body.model_dump(mode="json"))


def check_no_functions(req: ChatCompletionRequest) -> None:
    """400 for OpenAI's deprecated ``functions`` / ``function_call`` (use ``tools`` / ``tool_choice``), as vLLM.

    Raises OpenAIError (400) naming the parameter: non-empty functions (with their names), a function_call other
    than 'none'. Absent, null and empty lists are accepted."""
    if req.functions:
        raise refusal_error(deprecated_functions([e.get("name") for e in req.functions]))
    choice = req.function_call
    if choice is not None and choice != "none":
        raise refusal_error(deprecated_function_call(choice))


def _echo(req: ChatCompletionRequest) -> str:
    """What ``echo`` puts before each reply (vLLM's rule): the last message's content when that message is the
    assistant's (the role of the reply), else nothing."""
    if not req.echo:
        return ""
    last = chat_messages([req.messages[-1].model_dump(exclude_none=True)])[0]
    return last["content"] if last["role"] == "assistant" else ""


def template_options(ctx: ServingContext, req) -> ChatTemplateOptions:
    """A chat request's (or a chat /tokenize request's) template options: its own template only with
    ``--trust-request-chat-template`` (as vLLM: a template is code the server runs), else ``--chat-template``'s or
    the tokenizer's; ``--default-chat-template-kwargs`` under the request's own. 400 for a request template without
    that flag, and for options no template can take (both add_generation_prompt and continue_final_message)."""
    kwargs = req.chat_template_kwargs
    own = req.chat_template is not None or (isinstance(kwargs, dict) and kwargs.get("chat_template") is not None)
    if own and not ctx.chat.trust_request_chat_template:
        path = ("chat_template",) if req.chat_template is not None else ("chat_template_kwargs", "chat_template")
        raise refusal_error(untrusted_chat_template(path))
    options = ChatTemplateOptions(
        req.chat_template or ctx.chat.chat_template,
        req.add_generation_prompt,
        req.continue_final_message,
        {**(ctx.chat.default_chat_template_kwargs or {}), **(kwargs or {})},
    )
    try:
        check_chat_template_options(options)
    except Refused as e:
        raise refused(e) from None
    return options


def _prepare(
    ctx: ServingContext,
    req: ChatCompletionRequest,
    options: ChatTemplateOptions,
    logprobs: int | None,
    constraint,
    mode: ToolMode,
) -> tuple[list[int], SamplingParams]:
    """The prompt's token ids (``render_chat``) and SamplingParams (``constraint``: the output's, the request's or
    its tools'), the prompt checked against the context; 400 for what is wrong. Runs on the tokenizer thread."""
    prompt_ids = truncate_prompt(ctx, render_chat(ctx, req, options), req)
    max_tokens_param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    max_tokens = getattr(req, max_tokens_param)
    params = sampling_params(
        ctx,
        req,
        ctx.check_prompt(prompt_ids, max_tokens, ("messages",), max_tokens_param),
        logprobs,
        "top_logprobs",
        constraint,
    )
    if mode.parser is not None and getattr(mode.parser, "skips_no_special_tokens", False):
        params.skip_special_tokens = False  # the parser's marker is a special token (vLLM's mistral parser does so)
    return prompt_ids, params


def render_chat(ctx: ServingContext, req, options: ChatTemplateOptions) -> list[int]:
    """The prompt token ids of a chat request (or a chat /tokenize request): the chat template over the messages
    (text parts joined) and the request's tools under ``options``, encoded with the request's
    ``add_special_tokens`` (vLLM's default false: the template holds them); 400 for a template that fails or is
    missing."""
    try:
        messages = chat_messages([m.model_dump(exclude_none=True) for m in req.messages])
    except RequestValueError as e:  # the checks pydantic cannot make (content with tool calls)
        raise request_error(e) from None
    tools = getattr(req, "tools", None)
    tools = [t.model_dump(exclude_none=True) for t in tools] if tools else None
    try:
        text = apply_chat_template(ctx.tokenizer, messages, options, tools=tools)
    except Refused as e:
        raise refused(e) from None
    return ctx.tokenizer.encode(text, add_special_tokens=req.add_special_tokens)


async def _last(outputs: AsyncIterator[tuple[int, RequestOutput]]) -> RequestOutput:
    final = None
    async for _, out in outputs:
        final = out
    return final


async def _stream(
    req: ChatCompletionRequest,
    model: str,
    request_id: str,
    outputs: AsyncIterator[tuple[int, RequestOutput]],
    include_usage: bool,
    mode: ToolMode,
    echo: str = "",
) -> AsyncIterator[dict]:
    def chunk(choices: list[ChatStreamChoice]) -> dict:
        d = ChatCompletionStreamResponse(id=request_id, model=model, choices=choices).model_dump(mode="json")
        for ch in d["choices"]:
            ch["delta"] = {k: v for k, v in ch["delta"].items() if v is not None}
        if not include_usage:
            d.pop("usage")
        return d

    # OpenAI's first chunk of each choice carries the role and empty content
    yield chunk([ChatStreamChoice(index=i, delta=ChatDelta(role="assistant", content="")) for i in range(req.n)])
    if echo:  # vLLM sends the echoed text as each choice's next chunk
        yield chunk([ChatStreamChoice(index=i, delta=ChatDelta(content=echo)) for i in range(req.n)])
    sent_tokens, finished = [0] * req.n, [False] * req.n
    tool_streams = [ToolStream(mode) for _ in range(req.n)]
    prompt_tokens = cached_tokens = 0
    async for _, out in outputs:
        prompt_tokens, cached_tokens = len(out.prompt_token_ids), out.num_cached_tokens
        choices = []
        for c in out.outputs:
            i = c.index
            if finished[i] or (len(c.token_ids) == sent_tokens[i] and c.finish_reason is None):
                continue
            content, tool_calls, finish_reason = tool_streams[i].feed(c.text, c.finish_reason)
            if mode.kind == "none":
                content = content or ""  # every chunk carries content, as before tools
            elif not content and not tool_calls and finish_reason is None:
                continue  # the tool parser holds these tokens back: no chunk (their logprobs go with the next one)
            logprobs = _logprobs(c, sent_tokens[i], len(c.token_ids), req.top_logprobs or 0) if req.logprobs else None
            choices.append(
                ChatStreamChoice(
                    index=i,
                    delta=ChatDelta(content=content, tool_calls=tool_calls),
                    logprobs=logprobs,
                    finish_reason=finish_reason,
                    stop_reason=c.stop_reason,
                )
            )
            sent_tokens[i], finished[i] = len(c.token_ids), c.finish_reason is not None
        if choices:
            yield chunk(choices)
    if include_usage:
        completion_tokens = sum(sent_tokens)
        usage = UsageInfo.of(prompt_tokens, completion_tokens, cached_tokens)
        yield ChatCompletionStreamResponse(id=request_id, model=model, choices=[], usage=usage).model_dump(mode="json")


def _logprobs(c: CompletionOutput, start: int, end: int, top_n: int) -> ChatChoiceLogprobs:
    """OpenAI's chat logprobs for generated tokens [start, end), each with its ``top_n`` alternatives."""
    content = []
    for tid, entry in zip(c.token_ids[start:end], (c.logprobs or [])[start:end]):
        sampled = entry[tid]
        top = sorted(entry.values(), key=lambda e: -e.logprob)[:top_n]
        content.append(
            ChatTokenLogprob(
                token=sampled.decoded_token,
                logprob=sampled.logprob,
                bytes=list(sampled.decoded_token.encode()),
                top_logprobs=[
                    TopLogprob(token=e.decoded_token, logprob=e.logprob, bytes=list(e.decoded_token.encode()))
                    for e in top
                ],
            )
        )
    return ChatChoiceLogprobs(content=content)
