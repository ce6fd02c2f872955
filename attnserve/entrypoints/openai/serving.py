"""What completions and chat completions share: the server's state (``ServingContext``: prompt checks), its
400s for refusals, running one HTTP request's prompts on the engine (with metrics), SSE framing, and aborting
when the client goes away. A request's fields -> SamplingParams: ``request_fields.py``; its output constraint:
``structured_fields.py``."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field

from fastapi import Request

from attnserve.engine.async_engine import AsyncLLMEngine, EngineNotReadyError
from attnserve.engine.outputs import RequestOutput
from attnserve.engine.request_checks import (
    EMPTY_PROMPT,
    MaxTokensTooLargeError,
    PromptTooLongError,
    RequestValueError,
    check_context_length,
    check_token_ids,
)
from attnserve.core.sampling_params import SamplingParams
from attnserve.entrypoints.openai.errors import OpenAIError, refusal_error
from attnserve.entrypoints.openai.metrics import ServerMetrics
from attnserve.entrypoints.openai.tokenizer_thread import TokenizerThread
from attnserve.executor.base import WorkerDiedError
from attnserve.refusals import Refused, dotted_path
from attnserve.refusals import serving as words


def request_error(e: RequestValueError) -> OpenAIError:
    """The 400 for a request check's refusal (``engine/request_checks.py``, the words LLM.generate and the CLI
    use): its place dotted as ``param`` and the value as JSON, ``prompt.2: 50000 not allowed (allowed: integer in
    [0, 49152), the vocabulary size)``."""
    return refusal_error(e.refusal)


def empty_prompt(path: tuple[str | int, ...], sent) -> OpenAIError:
    """The 400 for an empty prompt, one wording whatever its form: ``prompt: "" not allowed (allowed: a prompt of
    at least 1 token)``, ``prompt.1: [] ...``; ``sent`` is the value as the request holds it."""
    return request_error(RequestValueError(path, sent, EMPTY_PROMPT))


def load_error_summary(e: BaseException) -> str:
    """One line for a load error, without a worker's traceback (it stays in the server log): a WorkerDiedError's
    ``summary``, else the message on one line (its type's name when it has none)."""
    text = e.summary if isinstance(e, WorkerDiedError) else str(e)
    return " ".join(text.split()) or type(e).__name__


@dataclass(frozen=True)
class ChatSettings:
    """The server's chat-template settings (vLLM's flags): ``--chat-template`` (its text, loaded; None: the
    tokenizer's), ``--default-chat-template-kwargs`` (under each request's own), ``--trust-request-chat-template``
    (a request's own ``chat_template`` is refused without it, as in vLLM: a template runs code on the server)."""

    chat_template: str | None = None
    default_chat_template_kwargs: dict | None = None
    trust_request_chat_template: bool = False


@dataclass
class ServingContext:
    """The server's shared state: the engine, the names it answers to, its metrics, the thread that runs the
    server's tokenizer calls (``tokenizer_thread.py``: tokenizing is kept off the event loop)."""

    engine: AsyncLLMEngine
    served_model_names: list[str]
    metrics: ServerMetrics
    api_key: str | None = None
    metrics_without_auth: bool = False  # with an API key: /metrics answers without it
    enable_auto_tool_choice: bool = False  # tool_choice "auto" allowed (with tool_parser)
    tool_parser: str | None = None  # tool_parsers.TOOL_PARSERS' name: reads tool calls out of "auto" outputs
    tokenizer_thread: TokenizerThread = field(default_factory=TokenizerThread)
    chat: ChatSettings = field(default_factory=ChatSettings)

    @property
    def model_name(self) -> str:
        return self.served_model_names[0]

    @property
    def tokenizer(self):
        return self.engine.engine.tokenizer

    @property
    def generation_defaults(self) -> dict:
        """The generation config's default sampling values (``--generation-config``): field -> value."""
        return self.engine.engine.generation_defaults

    @property
    def max_model_len(self) -> int:
        return self.engine.engine.max_model_len

    @property
    def vocab_size(self) -> int:
        return self.engine.engine.vocab_size

    def check_ready(self) -> None:
        if not self.engine.is_ready:
            if self.engine.load_error is not None:
                raise OpenAIError(words.load_failed(load_error_summary(self.engine.load_error)), 503)
            if self.engine.dead_error is not None:  # a worker died: restart the server
                raise OpenAIError(words.engine_dead_restart(self.engine.dead_error), 503)
            if self.engine.is_stopping:
                raise OpenAIError(words.SHUTTING_DOWN_RETRY, 503, code="shutting_down")
            raise OpenAIError(words.STARTING, 503)

    def check_model(self, name: str | None) -> str:
        """The model name to answer with; 400 for a name this server does not serve."""
        if not name:
            return self.model_name
        if name not in self.served_model_names:
            # 404 as OpenAI's API and vLLM answer a model that is not there (the body's code says which)
            raise OpenAIError(
                words.no_such_model(name, self.served_model_names), 404, param="model", code="model_not_found"
            )
        return name

    def check_token_ids(self, token_ids: list[int], path: tuple[str | int, ...] = ("prompt",)) -> None:
        """400 for an empty prompt or a token id outside the vocabulary, named by its position (``prompt.1.2``)
        (the length is check_prompt's)."""
        if not token_ids:
            raise empty_prompt(path, token_ids)
        try:
            check_token_ids(token_ids, self.vocab_size, path)
        except RequestValueError as e:
            raise request_error(e) from None

    def check_prompt(
        self,
        token_ids: list[int],
        max_tokens: int | None,
        path: tuple[str | int, ...] = ("prompt",),
        max_tokens_param: str = "max_tokens",
    ) -> int:
        """Validate one tokenized prompt; return the max_tokens to use (None = the rest of the context). A prompt
        too long is ``request_checks.check_context_length``'s 400 (LLM.generate's words): ``param`` the prompt's
        ``path`` (``prompt.1``, ``messages``) when the prompt alone leaves no room, ``max_tokens_param`` (the
        field the request set: ``max_tokens``, ``max_completion_tokens``) when the prompt fits but not with it."""
        self.check_token_ids(token_ids, path)
        try:
            return check_context_length(len(token_ids), max_tokens, self.max_model_len)
        except PromptTooLongError as e:
            raise OpenAIError(str(e), 400, param=dotted_path(path)) from None
        except MaxTokensTooLargeError as e:
            raise OpenAIError(str(e), 400, param=max_tokens_param) from None


def refused(e: Refused) -> OpenAIError:
    """The 400 for any refusal (a chat template's, ...): its place as ``param``."""
    return refusal_error(e.refusal)


def prompt_logprobs(out: RequestOutput) -> list | None:
    """A finished output's prompt logprobs in vLLM's response shape (``protocol.PromptLogprobs``), or None."""
    if out.prompt_logprobs is None:
        return None
    return [
        None
        if d is None
        else {t: {"logprob": lp.logprob, "rank": lp.rank, "decoded_token": lp.decoded_token} for t, lp in d.items()}
        for d in out.prompt_logprobs
    ]


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


async def generate_all(
    ctx: ServingContext,
    prompts: list[list[int]],
    params: list[SamplingParams],
    request_id: str,
    arrival: float | None = None,
) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Run every prompt of one HTTP request; yield (prompt index, output) as outputs arrive.

    Records each prompt's TTFT/TPOT/latency when it finishes, in seconds from ``arrival`` (``time.monotonic()``
    when the handler began, so that tokenizing and its wait for the tokenizer thread count; None: from now).
    Closing the iterator early aborts the unfinished prompts (each ``engine.generate`` aborts its own request)."""
    t0 = time.monotonic() if arrival is None else arrival
    first: dict[int, float] = {}
    done: set[int] = set()

    def record(i: int, out: RequestOutput) -> None:
        now = time.monotonic()
        first.setdefault(i, now)
        if out.finished:
            done.add(i)
            ctx.metrics.observe_request(
                ttft=first[i] - t0,
                e2e=now - t0,
                num_output_tokens=sum(len(c.token_ids) for c in out.outputs),
                num_prompt_tokens=len(out.prompt_token_ids),
                finish_reasons=[c.finish_reason or "abort" for c in out.outputs],
            )

    streams = [ctx.engine.generate(p, sp, f"{request_id}-{i}") for i, (p, sp) in enumerate(zip(prompts, params))]
    try:
        async for i, out in _merge(streams):
            record(i, out)
            yield i, out
    except EngineNotReadyError as e:
        raise OpenAIError(str(e), 503) from None
    except PromptTooLongError as e:
        raise OpenAIError(str(e), 400, param="prompt") from None
    except ValueError as e:  # the engine rejected a prompt
        raise OpenAIError(str(e), 400) from None
    finally:
        if len(done) < len(prompts):
            ctx.metrics.requests_aborted.labels(ctx.model_name).inc()


async def _merge(streams: list[AsyncIterator[RequestOutput]]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Interleave async iterators as their items arrive. One stream is iterated directly (no task).

    Each stream has at most one item in hand: its next item is asked for only once the consumer has taken the
    one before (an output's lists grow when its stream's next item is taken), so a consumer that stops reading
    holds one output per stream, never a queue of them."""
    if len(streams) == 1:
        try:
            async for out in streams[0]:
                yield 0, out
        finally:
            await streams[0].aclose()
        return
    pending = {asyncio.ensure_future(anext(s)): i for i, s in enumerate(streams)}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in sorted(done, key=pending.__getitem__):
                i = pending.pop(task)
                try:
                    out = task.result()
                except StopAsyncIteration:
                    continue
                yield i, out
                pending[asyncio.ensure_future(anext(streams[i]))] = i
    finally:
        for task in pending:
            task.cancel()  # the generate() it runs aborts its request as it unwinds
        await asyncio.gather(*pending, return_exceptions=True)
        for s in streams:
            await s.aclose()  # a stream without a task in hand (its item just yielded): aborts its request


async def until_disconnected(request: Request, work: Awaitable):
    """Await ``work``, cancelling it (which aborts its engine requests) if the client disconnects first.

    Returns (True, result) or (False, None) when the client went away."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watch = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)  # let it unwind (abort) before we answer
    if task.cancelled():
        return False, None
    return True, task.result()


def sse(data: dict | str) -> str:
    """One server-sent event carrying JSON (or the literal ``[DONE]``)."""
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


async def sse_stream(chunks: AsyncIterator[dict]) -> AsyncIterator[str]:
    """SSE framing with OpenAI's end marker; an error after the headers went out is sent as an event."""
    try:
        async for chunk in chunks:
            yield sse(chunk)
    except OpenAIError as e:
        yield sse(e.body().model_dump())
    except Exception as e:  # noqa: BLE001 - the status is already 200; tell the client in-band
        yield sse(OpenAIError(f"{type(e).__name__}: {e}", 500).body().model_dump())
    yield sse("[DONE]")
