"""``attnserve serve [MODEL]``: the OpenAI-compatible HTTP server."""

from __future__ import annotations

import argparse
import gc
import logging
import socket
import sys

from attnserve.config import EngineConfig
from attnserve.entrypoints.cli.arg_types import nonnegative_int, one_of, port, positive_int, seconds
from attnserve.entrypoints.cli.chat_args import add_chat_template_args
from attnserve.entrypoints.cli.engine_args import ConfigError, add_engine_args, engine_config_from_args, error_line


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "serve",
        help="start the OpenAI-compatible HTTP server",
        description="Serve a model over OpenAI's HTTP API (/v1/completions, /v1/chat/completions, /v1/models, "
        "/health, /version, /metrics).",
    )
    g = parser.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 for all)")
    g.add_argument("--port", type=port, default=8000, help="TCP port (default 8000)")
    g.add_argument(
        "--served-model-name",
        nargs="+",
        default=None,
        metavar="NAME",
        help="model name(s) clients use; the first is reported (default: the model argument)",
    )
    g.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' on /v1 routes, /reset_prefix_cache, /metrics and the API "
        "docs (/health and /version stay open); an empty key means no key, as in vLLM",
    )
    g.add_argument(
        "--metrics-without-auth",
        action="store_true",
        help="with --api-key: /metrics answers without the key (for a scraper that has none)",
    )
    g.add_argument(
        "--shutdown-timeout",
        type=seconds,
        default=10.0,
        help="seconds in-flight requests may run on after SIGINT/SIGTERM before they are aborted "
        "(default 10; 0: at once; an aborted request ends with finish_reason abort)",
    )
    g.add_argument("--log-level", default="info", **one_of(["critical", "error", "warning", "info", "debug"]))
    from attnserve.entrypoints.openai.tool_parsers import TOOL_PARSERS

    g.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help='allow tool_choice "auto" (the default when a request has tools): the model decides whether '
        "to call tools; needs --tool-call-parser",
    )
    g.add_argument(
        "--tool-call-parser",
        default=None,
        **one_of(sorted(TOOL_PARSERS)),
        help="the format the model writes tool calls in, read out of auto tool-choice outputs; needs "
        "--enable-auto-tool-choice",
    )
    add_chat_template_args(parser, serve=True)
    _add_limit_args(parser)
    add_engine_args(parser, positional_model=True)
    parser.set_defaults(func=run)
    return parser


def _add_limit_args(parser: argparse.ArgumentParser) -> None:
    """Limits against hostile and slow clients (docs/serving.md, "Limits"); each refusal is OpenAI's error body
    with ``code`` naming the limit."""
    from attnserve.entrypoints.openai.body_limit import DEFAULT_MAX_REQUEST_BODY_BYTES
    from attnserve.entrypoints.openai.connection import ConnectionLimits

    d = ConnectionLimits()
    g = parser.add_argument_group("limits (0 turns a limit or deadline off)")
    g.add_argument(
        "--max-request-body-bytes",
        type=nonnegative_int,
        default=DEFAULT_MAX_REQUEST_BODY_BYTES,
        metavar="BYTES",
        help=f"larger request bodies are answered 413, refused while they are read "
        f"(default {DEFAULT_MAX_REQUEST_BODY_BYTES}: 8 MiB)",
    )
    g.add_argument(
        "--timeout-request-header",
        type=seconds,
        default=d.timeout_request_header,
        metavar="S",
        help=f"seconds a connection has to send a request's headers, else 408 and closed "
        f"(default {d.timeout_request_header:g})",
    )
    g.add_argument(
        "--timeout-request-body",
        type=seconds,
        default=d.timeout_request_body,
        metavar="S",
        help=f"seconds a request has to send its body after its headers, else 408 and closed "
        f"(default {d.timeout_request_body:g})",
    )
    g.add_argument(
        "--timeout-write-stall",
        type=seconds,
        default=d.timeout_write_stall,
        metavar="S",
        help=f"seconds a client may leave its response unread (the send buffer full) before the "
        f"connection is closed and its request aborted (default {d.timeout_write_stall:g})",
    )
    g.add_argument(
        "--timeout-keep-alive",
        type=seconds,
        default=5.0,
        metavar="S",
        help="seconds an idle kept-alive connection stays open (default 5, as uvicorn and vLLM)",
    )
    g.add_argument(
        "--limit-concurrency",
        type=positive_int,
        default=None,
        metavar="N",
        help="connections (and requests in progress) at most; more are answered 503 (default 4096, "
        "or the open-file limit minus 128 when that is lower)",
    )
    g.add_argument(
        "--h11-max-incomplete-event-size",
        type=positive_int,
        default=d.h11_max_incomplete_event_size,
        metavar="BYTES",
        help=f"bytes of a request's header block at most, else 431 (default "
        f"{d.h11_max_incomplete_event_size}, as vLLM)",
    )
    g.add_argument(
        "--h11-max-header-count",
        type=positive_int,
        default=d.h11_max_header_count,
        metavar="N",
        help=f"request headers at most, else 431 (default {d.h11_max_header_count}, as vLLM)",
    )


def limits_from_args(args: argparse.Namespace):
    """(max request body bytes or None, ConnectionLimits) from the flags; 0 turns a limit off."""
    from attnserve.entrypoints.openai.connection import ConnectionLimits

    def off(value):
        return value or None

    return off(args.max_request_body_bytes), ConnectionLimits(
        timeout_request_header=off(args.timeout_request_header),
        timeout_request_body=off(args.timeout_request_body),
        timeout_write_stall=off(args.timeout_write_stall),
        limit_concurrency=args.limit_concurrency,
        h11_max_header_count=args.h11_max_header_count,
        h11_max_incomplete_event_size=args.h11_max_incomplete_event_size,
    )


def _error(args: argparse.Namespace, e: ValueError) -> int:
    """One line naming the flag of the setting ``e`` is keyed to (as generate's); exit status 2."""
    print(f"attnserve serve: error: {error_line(args, e)}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    from attnserve.entrypoints.openai.listen import bind_socket, cannot_listen_message

    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(asctime)s %(name)s: %(message)s")
    if args.metrics_without_auth and not args.api_key:  # nothing to answer without: it would do nothing
        print(
            "attnserve serve: error: argument --metrics-without-auth: only with --api-key (without a key every "
            "endpoint answers without one)",
            file=sys.stderr,
        )
        return 2
    if args.enable_auto_tool_choice != (args.tool_call_parser is not None):  # one without the other does nothing
        flag, needs = (
            ("--enable-auto-tool-choice", "--tool-call-parser")
            if args.enable_auto_tool_choice
            else ("--tool-call-parser", "--enable-auto-tool-choice")
        )
        print(f"attnserve serve: error: argument {flag}: needs {needs}", file=sys.stderr)
        return 2
    config = engine_config_from_args(args)
    try:  # the address first: a port in use is one line now, not after the model's checks and load (seconds)
        sock = bind_socket(args.host, args.port)
    except OSError as e:  # a condition of this machine, not a bad flag value: exit 1
        print(f"attnserve serve: error: {cannot_listen_message(args.host, args.port, e)}", file=sys.stderr)
        return 1
    try:
        return _serve(args, config, sock)
    finally:
        sock.close()  # run_server closes it too; here for the returns before it


def _serve(args: argparse.Namespace, config: EngineConfig, sock: socket.socket) -> int:
    """Fetch the model, check its config, serve on the bound ``sock``; the exit code."""
    from attnserve.entrypoints.openai.server import ServerArgs, run_server
    from attnserve.entrypoints.openai.serving import ChatSettings
    from attnserve.model_executor.loader import fetch_model

    try:  # a hub model downloads here, in the foreground with progress bars; the engine then finds it cached
        fetch_model(config.model)
    except FileNotFoundError as e:  # ModelNotFoundError: one line saying what to do, not a failed engine thread
        print(f"attnserve serve: error: {e}", file=sys.stderr)
        return 2
    from attnserve.entrypoints.cli.held_logs import held_logs
    from attnserve.model_executor.preflight import preflight

    try:
        # heads the ranks cannot split, a backend that cannot run the model, a max_model_len or KV-cache budget
        # the model does not allow: one line and exit 2 now, as in generate, not a failed load (exit 1) once the
        # server listens; from the config alone, with the engine's own checks (their log only if they pass)
        with held_logs():
            preflight(config)
    except ValueError as e:
        return _error(args, e)
    except Exception:  # not a setting's error (an unreadable file, a bug): the load meets it and reports it, exit 1
        logging.getLogger(__name__).debug("the model's config check failed; the load will report it", exc_info=True)
    max_body, connection = limits_from_args(args)
    server_args = ServerArgs(
        host=args.host,
        port=args.port,
        served_model_names=tuple(args.served_model_name or ()),
        api_key=args.api_key or None,
        metrics_without_auth=args.metrics_without_auth,
        shutdown_timeout=args.shutdown_timeout,
        log_level=args.log_level,
        max_request_body_bytes=max_body,
        timeout_keep_alive=args.timeout_keep_alive,
        connection=connection,
        chat=ChatSettings(args.chat_template, args.default_chat_template_kwargs, args.trust_request_chat_template),
        enable_auto_tool_choice=args.enable_auto_tool_choice,
        tool_call_parser=args.tool_call_parser,
    )
    if args.chat_template is not None:
        logging.getLogger(__name__).info("using the chat template of --chat-template:\n%s", args.chat_template)
    try:
        code = run_server(config, server_args, sock)
    except ConfigError as e:  # a setting only the load could refuse (the GPU's memory once the weights are in)
        return _error(args, e)
    if code == 0:
        # the server has stopped and the process exits next: freeze what it leaves (~850k objects with the
        # default model, ~600k of them the cached GGUF reader's) so that the interpreter's teardown does not
        # traverse them in its garbage collections: over a second of CPU after "Finished server process",
        # several seconds on a busy machine
        gc.freeze()
    return code
