"""The OpenAI-compatible HTTP server: FastAPI routes over an AsyncLLMEngine, run by uvicorn.

The app starts answering as soon as it listens: while the model loads, ``/health`` and the API
answer 503. A failed load ends the process with exit code 1 and one line on stderr; a load that refused a
setting (a keyed ConfigError) is raised by ``run_server`` for ``attnserve serve`` to name the flag (exit 2).

SIGINT/SIGTERM: the server keeps accepting connections but answers new requests (and ``/health``) 503 in
OpenAI's error format, with ``Connection: close``; it lets the requests in flight run for ``shutdown_timeout``
seconds (default 10: a rolling restart drains), then aborts the rest between two engine steps. Once no request
is left in the engine, uvicorn stops listening and shuts down. Each aborted request still gets its answer: a
stream's last chunk has finish_reason "abort", then ``data: [DONE]``; a non-streamed request gets its partial
result with finish_reason "abort". uvicorn waits up to ``ABORT_GRACE_S`` more for those answers to go out, the
engine thread stops, and the process exits 0. A second signal aborts the requests in flight at once.

Hostile and slow clients: request bodies are limited while they are read (``body_limit.py``), each connection
has deadlines for its request's headers and body and for a client that stops reading, and connections are
capped (``connection.py``); a stream's outputs wait in one slot, not a queue (``engine/output_collector.py``).
"""

from __future__ import annotations

import functools
import hmac
import logging
import os
import resource
import signal
import socket
import sys
import dataclasses
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

import attnserve
from attnserve.config.engine import EngineConfig
from attnserve.config.fields import ConfigError
from attnserve.engine.async_engine import AsyncLLMEngine
from attnserve.engine.gc_heap import freeze_heap
from attnserve.engine.llm_engine import LLMEngine
from attnserve.entrypoints.openai.body import JSONBodyRoute
from attnserve.entrypoints.openai.body_limit import DEFAULT_MAX_REQUEST_BODY_BYTES, RequestBodyLimit
from attnserve.entrypoints.openai.connection import ConnectionLimits, guarded_protocol
from attnserve.entrypoints.openai.errors import (
    OpenAIError,
    body_message,
    error_response,
    json_error_message,
    status_phrase,
    validation_message,
)
from attnserve.entrypoints.openai.listen import bind_socket, cannot_listen_message
from attnserve.entrypoints.openai.metrics import ServerMetrics
from attnserve.entrypoints.openai.protocol import (
    CompletionRequest,
    CompletionResponse,
    ErrorResponse,
    ModelCard,
    ModelList,
    VersionResponse,
)
from attnserve.entrypoints.openai.protocol_chat import ChatCompletionRequest, ChatCompletionResponse
from attnserve.entrypoints.openai.protocol_tokenize import DetokenizeResponse, TokenizeResponse
from attnserve.entrypoints.openai.serving import ChatSettings, ServingContext, load_error_summary
from attnserve.entrypoints.openai.serving_chat import create_chat_completion
from attnserve.entrypoints.openai.serving_completion import create_completion
from attnserve.entrypoints.openai.serving_tokenize import DETOKENIZE_BODY, TOKENIZE_BODY, detokenize, tokenize
from attnserve.refusals import serving as words

logger = logging.getLogger(__name__)

# after the requests in flight were aborted: how long their last chunks have to go out (the abort lands
# between two engine steps) before uvicorn cancels what is left, and how long the engine thread then has to stop
ABORT_GRACE_S = 5.0

_API_ERRORS = {s: {"model": ErrorResponse, "description": status_phrase(s)} for s in (400, 401, 413, 503)}
_SSE = {"text/event-stream": {"schema": {"type": "string"}, "description": "with stream: true"}}
_BODY_MODELS = {"/v1/completions": CompletionRequest, "/v1/chat/completions": ChatCompletionRequest}  # for 400s
_KNOWN_PATHS = {
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/models",
    "/health",
    "/version",
    "/metrics",
    "/reset_prefix_cache",
    "/tokenize",
    "/detokenize",
}
# what --api-key guards: the API, what changes the engine's state, the API schema and (unless
# --metrics-without-auth) the metrics; /health and /version stay open for load balancers and probes
_GUARDED = ("/v1", "/reset_prefix_cache", "/tokenize", "/detokenize", "/docs", "/redoc", "/openapi.json")


def guarded(path: str, metrics_without_auth: bool) -> bool:
    """Whether ``path`` needs the API key when one is set."""
    return path.startswith(_GUARDED) or (path == "/metrics" and not metrics_without_auth)


def authorized(authorization: bytes, key: str) -> bool:
    """Whether an ``Authorization`` header value carries ``key`` as a bearer token: the scheme in any case
    (RFC 9110 section 11.1), one or more spaces, the token compared in constant time (``hmac.compare_digest``)."""
    scheme, _, token = authorization.partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(token.lstrip(b" "), key.encode())


@dataclass(frozen=True)
class ServerArgs:
    """How to serve: address, the names the model answers to, the key, the shutdown grace period."""

    host: str = "127.0.0.1"
    port: int = 8000
    served_model_names: tuple[str, ...] = ()
    api_key: str | None = None
    metrics_without_auth: bool = False  # with an API key: /metrics answers without it
    shutdown_timeout: float = 10.0  # seconds in-flight requests may run on after SIGINT/SIGTERM, then aborted
    log_level: str = "info"
    enable_auto_tool_choice: bool = False  # tool_choice "auto": the model decides, tool_parser reads its calls
    tool_call_parser: str | None = None  # tool_parsers.TOOL_PARSERS' name
    chat: ChatSettings = ChatSettings()  # --chat-template, --default-chat-template-kwargs, --trust-request-...
    max_request_body_bytes: int | None = DEFAULT_MAX_REQUEST_BODY_BYTES  # None: no limit
    timeout_keep_alive: float = 5.0  # seconds an idle kept-alive connection stays open (uvicorn's, vLLM's 5)
    # deadlines and caps per connection (connection.py); limit_concurrency None: default_limit_concurrency()
    connection: ConnectionLimits = ConnectionLimits(limit_concurrency=None)


def default_limit_concurrency() -> int:
    """4096 connections, or fewer when the process may open fewer files (128 kept for the server's own)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 4096 if soft == resource.RLIM_INFINITY else max(16, min(4096, soft - 128))


def default_served_name(model: str | None) -> str:
    """The name clients use: the --model string as given, or the default model's name."""
    if model:
        return model
    from attnserve.model_executor.loader import default_model_path

    return os.path.basename(default_model_path()).split(".")[0]


def build_app(ctx: ServingContext, max_request_body_bytes: int | None = DEFAULT_MAX_REQUEST_BODY_BYTES) -> FastAPI:
    """The FastAPI app over a (not yet started) engine; the lifespan starts and stops it. Request bodies over
    ``max_request_body_bytes`` (None: no limit) are answered 413 (``body_limit.py``)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        ctx.engine.start()
        yield
        ctx.tokenizer_thread.shutdown()
        await ctx.engine.shutdown(timeout=ABORT_GRACE_S)

    app = FastAPI(title="attnserve OpenAI-compatible API", version=attnserve.__version__, lifespan=lifespan)
    app.router.route_class = JSONBodyRoute  # bodies read by body.parse_body: a 400 of its own for each problem
    app.state.ctx = ctx
    _add_error_handlers(app)
    app.add_middleware(RequestBodyLimit, max_bytes=max_request_body_bytes)
    app.add_middleware(_AuthAndCount, ctx=ctx)  # the outer one: it counts the 413s too

    @app.get("/health", responses={503: _API_ERRORS[503]})
    async def health() -> Response:
        """200 once the model is loaded; 503 while loading, after a failed load, after a worker died, or while
        shutting down."""
        ctx.check_ready()
        return Response(status_code=200)

    @app.get("/version")
    async def version() -> VersionResponse:
        return VersionResponse(version=attnserve.__version__)

    @app.get("/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
    async def metrics() -> Response:
        """Prometheus text format."""
        return Response(ctx.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.post("/reset_prefix_cache", responses={401: _API_ERRORS[401], 503: _API_ERRORS[503]})
    async def reset_prefix_cache() -> Response:
        """Forget every cached prompt prefix (vLLM's endpoint): later requests compute their prompts anew. 200
        with an empty body; 503 while the model loads."""
        ctx.check_ready()
        await ctx.engine.reset_prefix_cache()
        return Response(status_code=200)

    @app.post(
        "/tokenize",
        responses={401: _API_ERRORS[401], 400: _API_ERRORS[400], 503: _API_ERRORS[503]},
        openapi_extra=TOKENIZE_BODY,
    )
    async def tokenize_route(raw: Request) -> TokenizeResponse:
        """vLLM's /tokenize: ``{"prompt": text}`` or ``{"messages": [...]}`` (the chat template's prompt) ->
        ``{"count", "max_model_len", "tokens", "token_strs"}``."""
        return await tokenize(ctx, raw)

    @app.post(
        "/detokenize",
        responses={401: _API_ERRORS[401], 400: _API_ERRORS[400], 503: _API_ERRORS[503]},
        openapi_extra=DETOKENIZE_BODY,
    )
    async def detokenize_route(raw: Request) -> DetokenizeResponse:
        """vLLM's /detokenize: ``{"tokens": [...]}`` -> ``{"prompt": text}``."""
        return await detokenize(ctx, raw)

    @app.get("/v1/models", responses={401: _API_ERRORS[401]})
    async def models() -> ModelList:
        max_len = ctx.max_model_len if ctx.engine.is_ready else None
        root = ctx.engine.config.model.model
        return ModelList(data=[ModelCard(id=name, root=root, max_model_len=max_len) for name in ctx.served_model_names])

    @app.post("/v1/completions", response_model=CompletionResponse, responses={200: {"content": _SSE}, **_API_ERRORS})
    async def completions(body: CompletionRequest, raw: Request) -> Response:
        return await create_completion(ctx, body, raw)

    @app.post(
        "/v1/chat/completions", response_model=ChatCompletionResponse, responses={200: {"content": _SSE}, **_API_ERRORS}
    )
    async def chat_completions(body: ChatCompletionRequest, raw: Request) -> Response:
        return await create_chat_completion(ctx, body, raw)

    return app


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(OpenAIError)
    async def openai_error(_: Request, e: OpenAIError) -> JSONResponse:
        return error_response(e.message, e.status, e.param, e.code)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        # malformed JSON and schema violations: 400 (FastAPI's default is 422), naming the first field
        errors = e.errors()
        first = errors[0] if errors else {}
        if first.get("type") == "json_invalid":  # loc is ("body", character offset): no parameter to name
            detail = (first.get("ctx") or {}).get("error", "invalid JSON")
            return error_response(json_error_message(detail, first.get("loc", (None, None))[-1], e.body), 400)
        body = body_message(first, request.headers.get("content-type"))  # not a JSON object at all
        if body is not None:
            return error_response(body, 400)
        message, param = validation_message(errors, _BODY_MODELS.get(request.url.path))
        return error_response(message, 400, param)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, e: StarletteHTTPException) -> JSONResponse:
        return error_response(
            str(e.detail),
            e.status_code,
            param=getattr(e, "param", None),
            code=getattr(e, "code", None),
            headers=getattr(e, "headers", None),
        )

    @app.exception_handler(Exception)
    async def internal(_: Request, e: Exception) -> JSONResponse:
        logger.exception("unhandled error")
        return error_response(words.internal_error(e), 500)


class _AuthAndCount:
    """ASGI middleware: the API key on /v1 routes (401 otherwise), and a request counter by status.

    Plain ASGI rather than BaseHTTPMiddleware, which would break streaming disconnect detection."""

    def __init__(self, app, ctx: ServingContext) -> None:
        self.app = app
        self.ctx = ctx

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        endpoint = path if path in _KNOWN_PATHS else "other"
        status = {"code": 500}

        async def counting_send(message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                if self.ctx.engine.is_stopping:  # draining: the client reconnects elsewhere for its next request
                    message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            await send(message)

        try:
            key = self.ctx.api_key
            if key and guarded(path, self.ctx.metrics_without_auth):  # an empty key: no key (as vLLM)
                headers = dict(scope.get("headers") or [])
                if not authorized(headers.get(b"authorization", b""), key):
                    response = error_response(words.WRONG_API_KEY, 401, code="invalid_api_key")
                    return await response(scope, receive, counting_send)
            await self.app(scope, receive, counting_send)
        finally:
            self.ctx.metrics.http_requests.labels(endpoint, str(status["code"])).inc()


def run_server(config: EngineConfig, args: ServerArgs, sock: socket.socket | None = None) -> int:
    """Serve until SIGINT/SIGTERM on ``sock``, a socket ``listen.bind_socket`` bound (``attnserve serve`` binds it
    before it checks the model's config), or, when None, one bound here to ``args.host:args.port``; the socket is
    closed on return. Returns the exit code: 0, or 1 when the engine failed to load or the address cannot be bound
    (one line on stderr, before the model loads). A load that failed on a setting (a ConfigError with a ``key``,
    e.g. a KV-cache budget that holds no block) raises that error once the server has stopped, for the caller to
    name the flag."""
    import uvicorn

    if sock is None:
        try:
            sock = bind_socket(args.host, args.port)
        except OSError as e:
            print(f"attnserve serve: error: {cannot_listen_message(args.host, args.port, e)}", file=sys.stderr)
            return 1
    port = sock.getsockname()[1]
    names = list(args.served_model_names) or [default_served_name(config.model.model)]
    # a KV cache shorter than max_model_len: refused, as vLLM does, not requests cut short while /v1/models
    # reports max_model_len (serve's preflight refuses it before the server listens when the budget is known then)
    engine = AsyncLLMEngine(config, functools.partial(LLMEngine, refuse_short_kv_cache=True, usage="server"))
    freeze_heap()  # one engine for the process's life: no full-collection pauses between steps
    ctx = ServingContext(
        engine=engine,
        served_model_names=names,
        metrics=ServerMetrics(names[0], lambda: engine.stats),
        api_key=args.api_key,
        metrics_without_auth=args.metrics_without_auth,
        chat=args.chat,
        enable_auto_tool_choice=args.enable_auto_tool_choice,
        tool_parser=args.tool_call_parser,
    )
    app = build_app(ctx, args.max_request_body_bytes)

    class Server(uvicorn.Server):
        """On the first SIGINT/SIGTERM the engine refuses new requests (503) and, after ``shutdown_timeout``
        seconds, aborts the running ones, which end their responses themselves; uvicorn keeps listening (new
        requests are answered 503) until the engine holds no request, then shuts down, waiting for the last
        answers (``timeout_graceful_shutdown``) instead of cancelling them mid-write. A second signal aborts
        the requests in flight at once."""

        draining = False

        def handle_exit(self, sig, frame) -> None:
            if not self.draining:
                self.draining = True
                engine.begin_shutdown(drain_timeout=args.shutdown_timeout)
                return
            engine.begin_shutdown(drain_timeout=0.0)
            super().handle_exit(sig, frame)

        async def on_tick(self, counter: int) -> bool:
            if self.draining and not self.should_exit and (engine.drained or not engine.is_loaded):
                self.should_exit = True
            return await super().on_tick(counter)

    limits = args.connection
    if limits.limit_concurrency is None:
        limits = dataclasses.replace(limits, limit_concurrency=default_limit_concurrency())
    server = Server(
        uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            http=guarded_protocol(limits),
            timeout_graceful_shutdown=ABORT_GRACE_S,
            timeout_keep_alive=args.timeout_keep_alive,
            h11_max_incomplete_event_size=limits.h11_max_incomplete_event_size,
        )
    )
    # a failed load ends the process (exit 1) instead of answering 503 forever: a supervisor restarts it
    engine.on_load_error = lambda e: setattr(server, "should_exit", True)
    logger.info("serving %s on http://%s:%d", names[0], args.host, port)
    # uvicorn re-raises the SIGINT/SIGTERM it caught once it has shut down, with the handlers it found
    # installed; no-op handlers make a graceful shutdown end in a normal return (exit code 0)
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if engine.load_error is not None:
        if isinstance(engine.load_error, ConfigError) and engine.load_error.key is not None:
            raise engine.load_error
        print(
            f"attnserve serve: error: the model failed to load: {load_error_summary(engine.load_error)}",
            file=sys.stderr,
        )
        return 1
    return 0
