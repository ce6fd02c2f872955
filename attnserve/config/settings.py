"""Setting: one value a user gave for one engine argument, and where; and the settings of each surface.

A config file's mapping (:func:`settings_from_mapping`), an attention_config object (:func:`attention_settings`) and
Python's keywords (:func:`python_settings`) become ordered lists of ``Setting``s with canonical keys
(:func:`normalize_key`); the command line's come from ``entrypoints/cli/engine_args.py``. ``engine_args.resolve``
applies them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from attnserve.config.attention import AttentionConfig
from attnserve.config.engine_arg_table import (
    ATTENTION_BACKEND,
    ATTENTION_CONFIG,
    ATTENTION_PREFIX,
    engine_arg_aliases,
    engine_arg_names,
    engine_args,
)
from attnserve.config.fields import (
    HUMAN_INT_WORDS,
    ConfigError,
    allowed_values,
    field_types,
    parse_human_int,
    setting_path,
    split_optional,
)
from attnserve.refusals import PYTHON, TEXT, Refusal, closest
from attnserve.refusals.config import (
    TYPE_NOUNS,
    ATTENTION_OBJECT,
    unknown_engine_argument,
    unknown_key,
)


@dataclass(frozen=True)
class Setting:
    """One value a user gave for one engine argument, and where they gave it."""

    key: str
    """Flat engine argument name, or ``attention_config.<field>``."""
    value: Any
    source: str
    """For ``attnserve config --explain``: ``command line (--block-size)``, ``file cfg.yaml``, ..."""
    label: str
    """How the user named it: ``--attention-backend``, ``attention_backend in cfg.yaml``, ``attention_backend=``."""
    where: str = ""
    """Prefix of an error about the value: ``argument --block-size``, ``cfg.yaml``, or empty."""
    own_flag: bool = False
    """Given with a flag of its own (``--block-size``), which names the setting: its error does not again."""
    cli: bool = False
    """Given on the command line (a flag of its own, or a field of ``-ac``'s JSON)."""
    spelling: str = ""
    """How the key was written (``num_gpu_blocks_override``, ``block-size``, ``backend in attention_config``, a flag's
    first option string): two spellings of one key in one file, on one command line or in one call that give
    different values are refused (:func:`check_spellings`); one spelling repeated is not (the later wins on the
    command line, as in argparse). Empty: not compared."""


def normalize_key(key: object, where: str) -> str:
    """Canonical engine-argument key for a user's key (``-`` or ``_``; ``attention_config.FIELD`` allowed).

    ``where`` completes the error, e.g. ``"in cfg.yaml"``. Unknown keys raise with a suggestion, a key that is not
    text shown as the file writes it (``true``).
    """
    name = str(key).replace("-", "_")
    if name.startswith(ATTENTION_PREFIX):
        return ATTENTION_PREFIX + AttentionConfig.normalize_key(name[len(ATTENTION_PREFIX) :], where)
    valid = engine_arg_names()
    if name not in valid:
        raise ConfigError(unknown_key(key, valid, where, closest(name, valid)))
    return engine_arg_aliases().get(name, name)


def attention_settings(
    values: object,
    source: str,
    in_where: str = "",
    where: str = "",
    cli: bool = False,
    spelling: str = "attention_config[{key!r}]",
) -> list[Setting]:
    """One Setting per field of an attention_config mapping (a JSON object, a file's nested object, a dict).

    ``in_where`` completes messages (``"in cfg.yaml"``, ``"in -ac"``); ``where`` prefixes value errors;
    ``spelling`` formats each key as written (``{key} in attention_config``).
    """
    if not isinstance(values, Mapping):
        raise ConfigError(
            Refusal(
                (ATTENTION_CONFIG,),
                values,
                noun=ATTENTION_OBJECT,
                origin=where,
                written=TEXT if in_where else PYTHON,
            )
        )
    out = []
    for key, value in values.items():
        name = AttentionConfig.normalize_key(key, in_where)
        out.append(
            Setting(
                ATTENTION_PREFIX + name,
                value,
                source,
                f"{ATTENTION_PREFIX}{name} {in_where}".strip(),
                where,
                cli=cli,
                spelling=spelling.format(key=key),
            )
        )
    return out


def settings_from_mapping(values: Mapping[Any, Any], source: str, in_where: str, where: str = "") -> list[Setting]:
    """Settings from a flat mapping of engine arguments (a config file's top level).

    ``attention_config`` may be a nested object or dotted keys. ``in_where`` is ``"in cfg.yaml"``. A number written
    as text is read as that number (:func:`number_from_text`).
    """
    out: list[Setting] = []
    for key, value in values.items():
        name = normalize_key(key, in_where)
        if name == ATTENTION_CONFIG:
            out += attention_settings(value, source, in_where, where, spelling=f"{{key}} in {key}")
        else:
            out.append(Setting(name, value, source, f"{name} {in_where}", where, spelling=str(key)))
    try:
        return [dataclasses.replace(s, value=number_from_text(s.key, s.value)) for s in out]
    except ConfigError as e:
        raise ConfigError(e.refusal.at(where)) if where else e from None


def _declared(key: str) -> tuple[type, str] | None:
    """The dataclass and field name that declare the engine argument ``key`` (``attention_config.X`` too)."""
    if key.startswith(ATTENTION_PREFIX):
        return AttentionConfig, key[len(ATTENTION_PREFIX) :]
    arg = engine_args().get(key)
    return (arg.owner, arg.name) if arg is not None else None


def number_from_text(key: str, value: Any) -> Any:
    """A config file's text value of an integer or number field, read as the command line reads the flag's text (as
    vLLM's --config passes every value through argparse as text): ``block_size: "32"`` is 32,
    ``gpu_memory_utilization: "0.5"`` 0.5, ``max_model_len: 32k`` 32000 (a ``human_readable`` field: vLLM's
    suffixes), ``max_model_len: "null"`` null (a field that takes null). Other values are returned as given, for the
    record to check (``32.0`` for an integer is a float, not an integer; ``"true"`` for a boolean is a string).
    Text that is no such number raises ConfigError in the command line's words: ``block_size '32.0' is not an
    integer (allowed: 1, 2, 4, ...)``."""
    declared = _declared(key)
    if declared is None or not isinstance(value, str):
        return value
    owner, name = declared
    base, optional = split_optional(field_types(owner)[name])
    if base not in (int, float):
        return value
    if optional and value.lower() in ("none", "null"):  # as --max-model-len null
        return None
    human = bool(owner.__dataclass_fields__[name].metadata.get("human_readable"))  # type: ignore[attr-defined]
    try:
        return parse_human_int(value) if human else base(value)  # type: ignore[operator]
    except ValueError:
        allowed = allowed_values(owner, name) + (f"; {HUMAN_INT_WORDS}" if human else "")
        raise ConfigError(
            Refusal(setting_path(key), value, allowed, noun=TYPE_NOUNS[base]),
        ) from None


def python_settings(
    model: str | None,
    attention_backend: Any,
    attention_config: AttentionConfig | Mapping[str, Any] | None,
    engine_kwargs: Mapping[str, Any],
) -> list[Setting]:
    """Settings from Python arguments (``LLM(...)``, ``build_engine_config(...)``)."""
    out: list[Setting] = []
    if model is not None:
        out.append(Setting("model", model, "python (model=)", "model="))
    # model, attention_backend and attention_config are parameters of their own, not **engine_kwargs
    valid = [n for n in engine_arg_names() if n not in ("model", ATTENTION_BACKEND, ATTENTION_CONFIG)]
    for key, value in engine_kwargs.items():
        name = key.replace("-", "_")
        if name not in valid:
            raise ConfigError(unknown_engine_argument(key, valid, closest(name, valid)))
        name = engine_arg_aliases().get(name, name)
        out.append(Setting(name, value, f"python ({name}=)", f"{name}=", spelling=f"{key}="))
    if attention_backend is not None:
        out.append(Setting(ATTENTION_BACKEND, attention_backend, "python (attention_backend=)", "attention_backend="))
    if isinstance(attention_config, AttentionConfig):
        for name, value in attention_config.to_dict().items():
            if name == "backend" and value is None:
                continue  # an AttentionConfig cannot tell "auto" from "not given": it names no backend
            out.append(
                Setting(ATTENTION_PREFIX + name, value, "python (attention_config=)", f"attention_config.{name}")
            )
    elif attention_config is not None:
        out += attention_settings(attention_config, "python (attention_config=)")
    return out
