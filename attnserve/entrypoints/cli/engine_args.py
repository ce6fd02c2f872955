"""The engine-argument flags shared by every subcommand that builds an engine (design §5).

A subcommand uses it with two calls:

    def add_parser(subparsers):
        p = subparsers.add_parser("generate", help=...)
        add_engine_args(p)                      # positional_model=True for `serve MODEL`-style commands
        ...                                     # the command's own flags
        p.set_defaults(func=run)

    def run(args):
        config = engine_config_from_args(args)  # exits 2 with one line on a bad value
        ...                                     # later: error_line(args, e) names the flag of a
                                                # setting that the model or a prompt turns out not to allow

The flags are generated from the config dataclasses (``attnserve.config.engine_args.engine_args``): one
flag per field, help from the field docstring. Attention: ``--attention-backend``, ``--attention-config
JSON`` / ``-ac JSON``, ``--attention-config.FIELD VALUE`` / ``-ac.FIELD VALUE`` (also ``=VALUE``), all
applied left to right. Files: ``--config FILE`` (YAML or JSON), ``--json-config FILE``. Precedence:
command line > files (in command-line order) > defaults.

The parser must be an ``EngineArgumentParser`` (``engine_arg_parser.py``; the ``attnserve`` command's subparsers
are one): it gives one-line errors, takes ``_`` and ``-`` alike in flag names, and names unknown flags with a
suggestion.
"""

from __future__ import annotations

import argparse
import json
from typing import Any, NoReturn

from attnserve.config import AttentionConfig, ConfigError, EngineConfig
from attnserve.config.engine_arg_table import EngineArg
from attnserve.config.engine_arg_table import ATTENTION_BACKEND, ATTENTION_PREFIX, engine_args
from attnserve.config.engine_args import Resolved, resolve
from attnserve.config.settings import Setting, attention_settings
from attnserve.config.fields import HUMAN_INT_WORDS, field_docs, split_optional
from attnserve.config.files import file_settings, loads_json
from attnserve.refusals import PYTHON, Refusal, Refused, message
from attnserve.refusals.config import model_given_twice
from attnserve.entrypoints.cli.arg_types import human_int, one_of, typed
from attnserve.entrypoints.cli.engine_arg_parser import EngineArgumentParser, _norm

__all__ = [
    "ConfigError",
    "EngineArgumentParser",
    "add_engine_args",
    "engine_config_from_args",
    "error_line",
    "resolve_engine_args",
]

_ITEMS = "_engine_arg_items"  # namespace attribute: Settings and config files, in command-line order
_PARSER = "_engine_arg_parser"  # namespace attribute: the parser that owns the engine flags
_RESOLVED = "_engine_arg_resolved"  # namespace attribute: the Resolved config, once built


def _record(namespace: argparse.Namespace, item: object) -> None:
    items = getattr(namespace, _ITEMS, None)
    if items is None:
        items = []
        setattr(namespace, _ITEMS, items)
    items.append(item)


class _SettingAction(argparse.Action):
    """Records ``Setting(key, value)`` in command-line order; nargs=0 flags record True (False for --no-X)."""

    def __init__(self, option_strings: list[str], dest: str, key: str, spelling: str = "", **kwargs: Any) -> None:
        self.key = key
        self.spelling = spelling or (option_strings[0] if option_strings else "")
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        if self.nargs == 0:
            values = not (option_string or "").startswith("--no-")
        # --block_size and --block-size are one flag to argparse, two spellings to check_spellings (and to the user)
        written = parser.written_as(option_string) if hasattr(parser, "written_as") else None
        respelled = written is not None and written != option_string
        spelling = written if respelled else self.spelling
        name = written if respelled else (option_string or self.metavar or self.dest)
        _record(
            namespace,
            Setting(
                self.key,
                values,
                f"command line ({name})",
                name,
                f"argument {name}",
                own_flag=True,
                cli=True,
                spelling=spelling,
            ),
        )


class _AttentionJsonAction(argparse.Action):
    """``--attention-config '{...}'`` / ``-ac '{...}'``: one Setting per key, in the object's order."""

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        try:
            obj = loads_json(values, "")
            for s in attention_settings(
                obj,
                f"command line ({option_string})",
                f"in {option_string}",
                f"argument {option_string}",
                cli=True,
                spelling=f"{{key}} in {self.option_strings[0]}",
            ):
                _record(namespace, s)
        except ConfigError as e:
            raise argparse.ArgumentError(
                None, message(e.refusal.at(f"argument {option_string}", written=e.refusal.written))
            ) from None


class _ConfigFileAction(argparse.Action):
    """``--config FILE`` / ``--json-config FILE``: remembered in order, read when the config is resolved."""

    def __init__(self, option_strings: list[str], dest: str, fmt: str, **kwargs: Any) -> None:
        self.fmt = fmt
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        _record(namespace, (values, self.fmt))


def _json_or_str(text: str) -> Any:
    """A dotted value: JSON-decoded (true, 3, null, "x"), else the raw string."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _converter(base: object, optional: bool, allowed: str, human_readable: bool = False):  # type: ignore[no-untyped-def]
    """The flag's argparse type: text that is not its int or float reads ``'x' is not an integer (allowed:
    ALLOWED)``; the range is checked when the config is built, for every surface alike. ``human_readable``: the
    integer may have vLLM's suffixes (``32k``, ``8G``: ``fields.parse_human_int``), and the error says which."""
    if base not in (int, float):
        return str
    parse = human_int(f"{allowed}; {HUMAN_INT_WORDS}") if human_readable else typed(base, allowed)  # type: ignore[arg-type]

    def convert(text: str) -> Any:
        return None if optional and text.lower() in ("none", "null") else parse(text)

    return convert


def _help(text: str) -> str:
    return text.replace("%", "%%")


def _add_flag(group: argparse._ArgumentGroup, arg: EngineArg) -> None:
    base, optional = split_optional(arg.type)
    flag = "--" + arg.name.replace("_", "-")
    choices = arg.field.metadata.get("choices")
    kwargs: dict[str, Any] = dict(action=_SettingAction, key=arg.name, default=argparse.SUPPRESS)
    if base is bool:
        kwargs.update(nargs=0)
    else:
        # a number's choices (--block-size) are checked with its range when the config is built, a text's (--dtype)
        # when the command line is parsed (before any other line): ``argument --dtype: 'fp9' not allowed (allowed:
        # ...)`` either way, as every surface says it, not argparse's ``invalid choice``
        if base is str and choices:
            kwargs.update(one_of([str(c) for c in choices], (arg.name,), arg.allowed))
        else:
            kwargs.update(type=_converter(base, optional, arg.allowed, arg.human_readable), metavar=arg.name.upper())
    group.add_argument(
        flag,
        *(["--no-" + flag[2:]] if base is bool else []),
        help=_help(f"{arg.doc} (default: {json.dumps(arg.default)})"),
        **kwargs,
    )
    if arg.short:  # vLLM's short form (-tp): the same flag, given again the later wins; a flag of its own, so
        # that an error names the one given
        group.add_argument(arg.short, help=f"same as {flag}", spelling=flag, **kwargs)
    for alias in arg.aliases:  # vLLM's spelling: a flag of its own, so that an error names the one given
        other = "--" + alias.replace("_", "-")
        group.add_argument(
            other, *(["--no-" + other[2:]] if base is bool else []), help=f"same as {flag} (vLLM's name)", **kwargs
        )


def add_engine_args(parser: argparse.ArgumentParser, *, positional_model: bool = False) -> None:
    """Add the config-file, engine and attention flags to ``parser`` (an EngineArgumentParser).

    ``positional_model``: also accept the model as an optional positional ``MODEL`` (``serve MODEL``).
    """
    if not isinstance(parser, EngineArgumentParser):
        raise TypeError("add_engine_args needs an EngineArgumentParser (the attnserve command's subparsers are one)")
    parser.has_engine_args = True
    parser.set_defaults(**{_PARSER: parser})
    if positional_model:
        parser.add_argument(
            "model_tag",
            metavar="MODEL",
            nargs="?",
            action=_SettingAction,
            key="model",
            default=argparse.SUPPRESS,
            help="the model (same as --model)",
        )

    files = parser.add_argument_group(
        "config files", "Keys are engine argument names; the command line overrides them."
    )
    files.add_argument(
        "--config",
        metavar="FILE",
        action=_ConfigFileAction,
        fmt="auto",
        default=argparse.SUPPRESS,
        help="YAML (.yaml/.yml) or JSON (.json) file of engine arguments",
    )
    files.add_argument(
        "--json-config",
        metavar="FILE",
        action=_ConfigFileAction,
        fmt="json",
        default=argparse.SUPPRESS,
        help="JSON file of engine arguments",
    )

    engine = parser.add_argument_group("engine")
    for arg in engine_args().values():
        _add_flag(engine, arg)

    attn = parser.add_argument_group(
        "attention",
        "Backend and options; JSON objects and dotted fields merge left to right (a repeated flag's later value "
        "wins; a field given both in a JSON object and dotted must have one value).",
    )
    attn.add_argument(
        "--attention-backend",
        metavar="NAME",
        action=_SettingAction,
        key=ATTENTION_BACKEND,
        default=argparse.SUPPRESS,
        help=_help(
            field_docs(AttentionConfig).get("backend", "") + " Conflicts with a different attention_config.backend."
        ),
    )
    attn.add_argument(
        "--attention-config",
        "-ac",
        metavar="JSON",
        action=_AttentionJsonAction,
        default=argparse.SUPPRESS,
        help='attention options as a JSON object, e.g. \'{"backend": "FLASHINFER"}\'',
    )
    docs = field_docs(AttentionConfig)
    for name in AttentionConfig.field_names():
        attn.add_argument(
            f"--attention-config.{name}",
            f"-ac.{name}",
            metavar="VALUE",
            action=_SettingAction,
            key=ATTENTION_PREFIX + name,
            type=_json_or_str,
            default=argparse.SUPPRESS,
            help=_help(docs.get(name, name)),
        )


def _fail(args: argparse.Namespace, e: ConfigError) -> NoReturn:
    parser = getattr(args, _PARSER, None)
    if parser is None:
        raise e
    parser.error(str(e))


def resolve_engine_args(args: argparse.Namespace) -> Resolved:
    """The EngineConfig and where each value came from. Exits 2 with one line on a bad value."""
    items = getattr(args, _ITEMS, None) or []
    cli = [i for i in items if isinstance(i, Setting)]
    try:
        models: dict[str, Setting] = {}  # per way of giving it (MODEL, --model) the last one, in line order
        for s in cli:
            if s.key == "model":
                models.pop(s.label, None)
                models[s.label] = s
        if len({s.value for s in models.values()}) > 1:  # argparse's form: the one given second named first
            first, later = models.values()
            raise ConfigError(
                Refusal(
                    value=later.value,
                    **model_given_twice(first.label, first.value),
                    origin=later.where,
                    names_path=True,
                    written=PYTHON,
                    key="model",
                )
            )
        from_files = [s for path, fmt in (i for i in items if isinstance(i, tuple)) for s in file_settings(path, fmt)]
        resolved = resolve(from_files + cli)
    except ConfigError as e:
        _fail(args, e)
    setattr(args, _RESOLVED, resolved)
    return resolved


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    """Build the EngineConfig from parsed flags: command line > config files > defaults.

    Exits with status 2 and one line naming the flag (or file and key), the value and what is allowed.
    """
    return resolve_engine_args(args).config


def error_line(args: argparse.Namespace, e: BaseException) -> str:
    """The line for ``e``, an error found only once the model, its config or a prompt is known (an explicit backend
    that cannot run the model, a prompt longer than the step's token budget). A refusal about one setting is placed
    where that setting was given, as a bad flag value's line is: ``argument --max-num-batched-tokens: ...`` for the
    command line (the flag names the setting: the line does not again, and its advice names flags, as given),
    ``cfg.yaml: ...`` for a config file, and by its flag when it was left at its default. Any other error, or no
    config resolved from ``args`` yet: ``str(e)``."""
    resolved = getattr(args, _RESOLVED, None)
    refusal = e.refusal if isinstance(e, Refused) else None
    key = e.key if isinstance(e, Refused) else None
    if refusal is None or key is None or resolved is None:
        return str(e)
    given = resolved.chosen.get(key)
    if given is None and key == ATTENTION_PREFIX + "backend":  # --attention-backend sets attention_config.backend
        given = resolved.chosen.get(ATTENTION_BACKEND)
    if given is not None and not given.cli:  # a file
        return message(refusal.at(given.where, written=refusal.written))
    where = (
        given.where
        if given is not None
        else (
            f"argument --attention-config.{key[len(ATTENTION_PREFIX) :]}"
            if key.startswith(ATTENTION_PREFIX)
            else f"argument --{_norm(key)}"
        )
    )
    flags = {k: s.label for k, s in resolved.chosen.items() if s.own_flag}  # the flag as given
    return message(
        refusal.at(where, names_path=given is None or given.own_flag, written=refusal.written),
        lambda k: flags.get(k, "--" + _norm(k)),
    )
