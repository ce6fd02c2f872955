"""Config files (YAML or JSON) and JSON option values -> engine-argument Settings.

A file is a mapping of engine argument names (``_`` or ``-``) to values, ``model`` included, with
``attention_config`` as a nested object or dotted keys. Every value is kept as written (``false`` too);
a duplicate key, an unknown key or a malformed file is an error naming the file (and line, column), and so
is a file that holds no mapping: an empty one (a file named on the command line that sets nothing is most
likely the wrong file), null, a list or a scalar. ``{}`` is the way to write "no settings".
"""

from __future__ import annotations

import json
import typing
from pathlib import Path
from typing import Any

import yaml

from attnserve.config.settings import Setting, settings_from_mapping
from attnserve.config.fields import ConfigError
from attnserve.refusals import Refusal
from attnserve.refusals.config import (
    EMPTY_CONFIG_FILE,
    NESTED_TOO_DEEPLY,
    ONLY_COMMENTS,
    config_mapping_words,
    duplicate_key,
    malformed,
    not_utf8_text,
    top_level_is,
    unreadable_config_file,
)


def _refused(origin: str, reason: str, allowed: str | None = None) -> ConfigError:
    return ConfigError(Refusal(reason=reason, allowed=allowed, origin=origin))


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _refused("", duplicate_key(key))
        out[key] = value
    return out


def loads_json(text: str, what: str) -> Any:
    """Decode JSON; errors name ``what`` (a file, or a flag) with line and column."""
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as e:
        if what:
            raise _refused(f"{what}:{e.lineno}:{e.colno}", malformed("JSON", e.msg)) from None
        raise _refused("", malformed("JSON", e.msg, e.lineno, e.colno)) from None
    except ConfigError as e:  # a duplicate key
        raise ConfigError(e.refusal.at(what)) from None
    except RecursionError:
        raise _refused(what, malformed("JSON", NESTED_TOO_DEEPLY)) from None


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys (PyYAML keeps the last one without a word)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:  # type: ignore[override]
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, typing.Hashable):
                continue  # SafeLoader reports the unhashable key itself
            if key in seen:
                raise yaml.constructor.ConstructorError(problem=duplicate_key(key), problem_mark=key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def loads_yaml(text: str, what: str) -> Any:
    """Decode YAML; errors name ``what`` with line and column."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{what}:{mark.line + 1}:{mark.column + 1}" if mark else what
        raise _refused(where, malformed("YAML", str(e.problem or e.context or ""))) from None
    except RecursionError:
        raise _refused(what, malformed("YAML", NESTED_TOO_DEEPLY)) from None
    except yaml.YAMLError as e:
        raise _refused(what, malformed("YAML", str(e))) from None


def read_config_file(path: str, fmt: str = "auto") -> dict[str, Any]:
    """Read a config file as a mapping. ``fmt``: ``json``, ``yaml``, or ``auto`` (by suffix; JSON for
    ``.json``, YAML otherwise — JSON is valid YAML, but JSON errors are clearer for ``.json``).

    Raises ConfigError naming the file for an unreadable or malformed file, and for one whose top level is
    not a mapping (empty, comments only, null, a list, a scalar); ``{}`` reads as no settings."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise _refused("", unreadable_config_file(path, e.strerror or str(e))) from None
    except UnicodeDecodeError as e:
        raise _refused("", unreadable_config_file(path, not_utf8_text(e.reason))) from None
    if fmt == "auto":
        fmt = "json" if path.lower().endswith(".json") else "yaml"
    allowed = config_mapping_words(fmt)
    if not text.strip():  # JSON's decoder says "Expecting value", YAML's reads null: one error for both
        raise _refused(path, EMPTY_CONFIG_FILE, allowed)
    data = loads_json(text, path) if fmt == "json" else loads_yaml(text, path)
    if data is None and fmt != "json" and yaml.compose(text, Loader=yaml.SafeLoader) is None:
        raise _refused(path, ONLY_COMMENTS, allowed)
    if not isinstance(data, dict):
        raise _refused(path, top_level_is(data), allowed)
    return data


def file_settings(path: str, fmt: str = "auto") -> list[Setting]:
    """The Settings a config file gives, in file order."""
    return settings_from_mapping(read_config_file(path, fmt), f"file {path}", f"in {path}", path)
