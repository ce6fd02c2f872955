"""``attnserve serve [MODEL]``: the OpenAI-compatible HTTP server."""

from __future__ import annotations

import argparse
import gc
import logging
import socket
import sys

from attnserve.config import EngineConfig
from attnserve.entrypoints.cli.arg_types import port, seconds
from attnserve.entrypoints.cli.engine_args import ConfigError, add_engine_args, engine_config_from_args, error_line


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "serve", help="start the OpenAI-compatible HTTP server",
        description="Serve a model over OpenAI's HTTP API (/v1/completions, /v1/chat/completions, /v1/models, "
                    "/health, /version, /metrics).")
    g = parser.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 for all)")
    g.add_argument("--port", type=port, default=8000, help="TCP port (default 8000)")
    g.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                   help="model name(s) clients use; the first is reported (default: the model argument)")
    g.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on /v1 routes, /reset_prefix_cache, /metrics and the API "
                        "docs (/health and /version stay open); an empty key means no key, as in vLLM")
    g.add_argument("--metrics-without-auth", action="store_true",
                   help="with --api-key: /metrics answers without the key (for a scraper that has none)")
    g.add_argument("--shutdown-timeout", type=seconds, default=10.0,
                   help="seconds in-flight requests may run on after SIGINT/SIGTERM before they are aborted "
                        "(default 10; 0: at once; an aborted request ends with finish_reason abort)")
    g.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    from attnserve.entrypoints.openai.tool_parsers import TOOL_PARSERS

    g.add_argument("--enable-auto-tool-choice", action="store_true",
                   help='allow tool_choice "auto" (the default when a request has tools): the model decides whether '
                        "to call tools; needs --tool-call-parser")
    g.add_argument("--tool-call-parser", default=None, choices=sorted(TOOL_PARSERS),
                   help="the format the model writes tool calls in, read out of auto tool-choice outputs; needs "
                        "--enable-auto-tool-choice")
    add_engine_args(parser, positional_model=True)
    parser.set_defaults(func=run)
    return parser


def _error(args: argparse.Namespace, e: ValueError) -> int:
    """One line naming the flag of the setting ``e`` is keyed to (as generate's); exit status 2."""
    print(f"attnserve serve: error: {error_line(args, e)}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    from attnserve.entrypoints.openai.listen import bind_socket, cannot_listen_message

    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(asctime)s %(name)s: %(message)s")
    if args.metrics_without_auth and not args.api_key:  # nothing to answer without: it would do nothing
        print("attnserve serve: error: argument --metrics-without-auth: only with --api-key (without a key every "
              "endpoint answers without one)", file=sys.stderr)
        return 2
    if args.enable_auto_tool_choice != (args.tool_call_parser is not None):  # one without the other does nothing
        flag, needs = (("--enable-auto-tool-choice", "--tool-call-parser") if args.enable_auto_tool_choice
                       else ("--tool-call-parser", "--enable-auto-tool-choice"))
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
    server_args = ServerArgs(host=args.host, port=args.port, served_model_names=tuple(args.served_model_name or ()),
                             api_key=args.api_key or None,
                             metrics_without_auth=args.metrics_without_auth, shutdown_timeout=args.shutdown_timeout, log_level=args.log_level,
                             enable_auto_tool_choice=args.enable_auto_tool_choice,
                             tool_call_parser=args.tool_call_parser)
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
