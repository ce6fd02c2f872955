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

from attnserve.config.engine_args import Setting, settings_from_mapping
from attnserve.config.fields import ConfigError
from attnserve.refusals import Refusal


def _refused(origin: str, reason: str, allowed: str | None = None) -> ConfigError:
    return ConfigError(Refusal(reason=reason, allowed=allowed, origin=origin))


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _refused("", f"duplicate key {key!r}")
        out[key] = value
    return out


def loads_json(text: str, what: str) -> Any:
    """Decode JSON; errors name ``what`` (a file, or a flag) with line and column."""
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as e:
        if what:
            raise _refused(f"{what}:{e.lineno}:{e.colno}", f"malformed JSON: {e.msg}") from None
        raise _refused("", f"malformed JSON (line {e.lineno}, column {e.colno}): {e.msg}") from None
    except ConfigError as e:  # a duplicate key
        raise ConfigError(e.refusal.at(what)) from None
    except RecursionError:
        raise _refused(what, "malformed JSON: nested too deeply") from None


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys (PyYAML keeps the last one without a word)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:  # type: ignore[override]
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, typing.Hashable):
                continue  # SafeLoader reports the unhashable key itself
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    problem=f"duplicate key {key!r}", problem_mark=key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def loads_yaml(text: str, what: str) -> Any:
    """Decode YAML; errors name ``what`` with line and column."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{what}:{mark.line + 1}:{mark.column + 1}" if mark else what
        problem = " ".join(str(e.problem or e.context or "").split())
        raise _refused(where, f"malformed YAML: {problem}") from None
    except RecursionError:
        raise _refused(what, "malformed YAML: nested too deeply") from None
    except yaml.YAMLError as e:
        raise _refused(what, f"malformed YAML: {' '.join(str(e).split())}") from None


def read_config_file(path: str, fmt: str = "auto") -> dict[str, Any]:
    """Read a config file as a mapping. ``fmt``: ``json``, ``yaml``, or ``auto`` (by suffix; JSON for
    ``.json``, YAML otherwise — JSON is valid YAML, but JSON errors are clearer for ``.json``).

    Raises ConfigError naming the file for an unreadable or malformed file, and for one whose top level is
    not a mapping (empty, comments only, null, a list, a scalar); ``{}`` reads as no settings."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise _refused("", f"cannot read config file {path!r}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise _refused("", f"cannot read config file {path!r}: not UTF-8 text ({e.reason})") from None
    if fmt == "auto":
        fmt = "json" if path.lower().endswith(".json") else "yaml"
    allowed = (
        "a mapping of engine argument names to values, e.g. "
        + ('{"dtype": "float32"}' if fmt == "json" else "'dtype: float32'")
        + ", or {} for no settings"
    )
    if not text.strip():  # JSON's decoder says "Expecting value", YAML's reads null: one error for both
        raise _refused(path, "empty config file", allowed)
    data = loads_json(text, path) if fmt == "json" else loads_yaml(text, path)
    if data is None and fmt != "json" and yaml.compose(text, Loader=yaml.SafeLoader) is None:
        raise _refused(path, "the config file holds only comments", allowed)
    if not isinstance(data, dict):
        raise _refused(path, f"the top level is {_describe(data)}", allowed)
    return data


def _describe(data: Any) -> str:
    """A decoded top level that is not a mapping, in the file's words: ``null``, ``a list``, ``the string
    'dtype float32'``, ``the number 5``, ``true``."""
    if data is None:
        return "null"
    if isinstance(data, bool):
        return str(data).lower()
    if isinstance(data, list):
        return "a list"
    if isinstance(data, str):
        return f"the string {data!r}"
    if isinstance(data, (int, float)):
        return f"the number {data!r}"
    return f"a {type(data).__name__}"  # a YAML date, timestamp or binary


def file_settings(path: str, fmt: str = "auto") -> list[Setting]:
    """The Settings a config file gives, in file order."""
    return settings_from_mapping(read_config_file(path, fmt), f"file {path}", f"in {path}", path)
