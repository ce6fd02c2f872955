"""The chat-template flags (vLLM's names): ``--chat-template`` for ``generate`` and ``serve``; for ``serve`` also
``--default-chat-template-kwargs`` and ``--trust-request-chat-template``. A bad value is argparse's one line, exit 2."""

from __future__ import annotations

import argparse
import json

from attnserve.refusals import Refused, statement
from attnserve.refusals.cli import not_json, not_json_object


def chat_template(text: str) -> str:
    """``--chat-template FILE|TEXT``: the template's text (``chat_utils.load_chat_template``: the file's contents, or
    the argument itself when it holds ``{``, ``}`` or a newline)."""
    from attnserve.entrypoints.chat_utils import load_chat_template

    try:
        return load_chat_template(text)
    except Refused as e:
        raise argparse.ArgumentTypeError(statement(e.refusal)) from None


def json_object(text: str) -> dict:
    """``--default-chat-template-kwargs JSON``: a JSON object."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(statement(not_json(text, e))) from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(statement(not_json_object(text)))
    return value


def add_chat_template_args(parser: argparse.ArgumentParser, serve: bool) -> None:
    """Add the chat-template flags to ``parser`` (``serve``: the server's two more)."""
    g = parser.add_argument_group("chat template")
    g.add_argument(
        "--chat-template",
        type=chat_template,
        default=None,
        metavar="FILE|TEXT",
        help="the Jinja chat template to use instead of the tokenizer's: a file, or the template itself"
        + ("" if serve else " (implies --chat)"),
    )
    if not serve:
        return
    g.add_argument(
        "--default-chat-template-kwargs",
        type=json_object,
        default=None,
        metavar="JSON",
        help="variables for the chat template under every request's own chat_template_kwargs, e.g. "
        "'{\"enable_thinking\": false}'",
    )
    g.add_argument(
        "--trust-request-chat-template",
        action="store_true",
        help="accept a request's own chat_template (refused without this flag: a template is code the server runs)",
    )
