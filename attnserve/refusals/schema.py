"""What a request field allows, in words, read from the request model's JSON schema (the ranges declared on
protocol.py's fields, which the OpenAPI schema shows too): ``integer >= 1, or null``, ``integer in [1, 128]``,
``number in (0, 1], or null``, ``true, false``, ``"system", "user"``.

A 400 for a value of the wrong type or out of range names the field, the value and these words
(``errors.validation_message``), instead of pydantic's ``Input should be a valid integer, got a number with a
fractional part``, which names neither the value nor what is allowed. A field whose range reads better in other
words than its bounds' digits (``seed``: ``integer in [-2^63, 2^63 - 1]``, the words of every seed's range) declares
them as ``json_schema_extra={"x-allowed": ...}``.

A missing required field, a value that is none of a union's members, a list where none is allowed or one too
short, reads every member as a noun (``required_words``): ``a string, a list of strings, a list of integers >=
0, or a list of lists of integers >= 0``, ``a non-empty list of chat messages``. A value where an object is
expected reads the object's fields (``object_words``): ``an object with "role" and "content", optionally
"name"``.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Iterator

from pydantic import BaseModel

from attnserve.refusals import range_words

_BOUNDS = (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="), ("exclusiveMaximum", "<"))


@functools.cache
def _schema(model: type[BaseModel]) -> dict[str, Any]:
    return model.model_json_schema()


def _resolve(root: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:  # "#/$defs/Name"
        node = root.get("$defs", {}).get(node["$ref"].rsplit("/", 1)[-1], {})
    return node


def _branches(root: dict[str, Any], node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """``node``'s alternatives (the members of an anyOf, nested ones flattened), references resolved."""
    node = _resolve(root, node)
    members = node.get("anyOf") or node.get("oneOf")
    if members is None:
        yield node
        return
    for member in members:
        yield from _branches(root, member)


def _leaves(root: dict[str, Any], node: dict[str, Any], path: tuple) -> Iterator[dict[str, Any]]:
    """The schemas that the value at ``path`` (field names and list indexes) may match, every union member's;
    a field's ``x-allowed`` words go with its members other than null."""
    words = _resolve(root, node).get("x-allowed")
    for branch in _branches(root, node):
        if not path:
            yield {**branch, "x-allowed": words} if words and branch.get("type") != "null" else branch
        elif isinstance(path[0], int) and branch.get("type") == "array":
            yield from _leaves(root, branch.get("items", {}), path[1:])
        elif isinstance(path[0], str) and path[0] in branch.get("properties", {}):
            yield from _leaves(root, branch["properties"][path[0]], path[1:])
        elif isinstance(path[0], str) and isinstance(branch.get("additionalProperties"), dict):  # a mapping's value
            yield from _leaves(root, branch["additionalProperties"], path[1:])


def _number(x: float) -> str:
    return str(int(x)) if isinstance(x, float) and x.is_integer() else str(x)


def _words(leaf: dict[str, Any]) -> str:
    """``integer >= 1``, ``integer in [1, 128]``, ``number in (0, 1]``, ``true, false``, ``string``,
    ``"system", "user"`` (a Literal's values)."""
    kind = leaf.get("type")
    if "x-allowed" in leaf:
        return leaf["x-allowed"]
    if "enum" in leaf or "const" in leaf:
        return ", ".join(json.dumps(v) for v in leaf.get("enum", [leaf.get("const")]))
    if kind == "boolean":
        return "true, false"
    if kind == "string" and leaf.get("minLength", 0) >= 1:
        return "non-empty string"
    if kind not in ("integer", "number"):
        return str(kind)
    bounds = {op: _number(leaf[key]) for key, op in _BOUNDS if key in leaf}
    low = next(((op, v) for op, v in bounds.items() if op in (">=", ">")), None)
    high = next(((op, v) for op, v in bounds.items() if op in ("<=", "<")), None)
    return range_words(kind, low, high)


def allowed_values(model: type[BaseModel], path: tuple, kinds: tuple[str, ...]) -> str | None:
    """What the field at ``path`` of ``model`` (``("max_tokens",)``, ``("prompt", 0)``) allows, in words:
    ``integer >= 1, or null``. ``kinds`` (JSON schema types: ``integer``, ``number``, ``boolean``, ``string``)
    pick among a union's members (``prompt.0``: a token id, not a string); None unless exactly one member of
    those kinds is there."""
    leaves = list(_leaves(_schema(model), _schema(model), tuple(path)))
    nullable = any(leaf.get("type") == "null" for leaf in leaves)
    typed = [leaf for leaf in leaves if leaf.get("type") in kinds]
    if len(typed) != 1:
        return None
    return _words(typed[0]) + (", or null" if nullable else "")


def _article(words: str) -> str:
    return ("an " if words[0] in "aeiou" else "a ") + words


def _noun(root: dict[str, Any], leaf: dict[str, Any], plural: bool = False) -> str:
    """One union member in words, as a noun: ``a string``, ``an integer >= 0``, ``a list of strings``, ``a
    non-empty list of chat messages`` (an object by its model's name), ``null``; ``plural`` for a list's items."""
    kind = leaf.get("type")
    if kind == "null":
        return "null"
    if "x-allowed" in leaf or "enum" in leaf or "const" in leaf:
        return _words(leaf)
    if kind == "array":
        items = " or ".join(dict.fromkeys(_noun(root, b, plural=True) for b in _branches(root, leaf.get("items", {}))))
        which = "non-empty list" if leaf.get("minItems", 0) >= 1 else "list"
        return f"{which}s of {items}" if plural else f"{_article(which)} of {items}"
    if kind in ("integer", "number"):
        words = _words(leaf)  # "integer >= 0"
        return kind + "s" + words[len(kind) :] if plural else _article(words)
    if kind == "string" and leaf.get("minLength", 0) >= 1:
        return "non-empty strings" if plural else "a non-empty string"
    values = leaf.get("additionalProperties")
    if kind == "object" and isinstance(values, dict) and "type" in values:  # a mapping: dict[str, float]
        return ("objects of " if plural else "an object of ") + _noun(root, values, plural=True)
    one, many = _NOUNS.get(kind if kind != "object" else leaf.get("title"), ("object", "objects"))
    return many if plural else _article(one)


# JSON schema types and request models (their schemas' titles) as nouns, for ``_noun``
_NOUNS = {
    "string": ("string", "strings"),
    "boolean": ("boolean", "booleans"),
    "ChatMessage": ("chat message", "chat messages"),
    "ContentPart": ('text part {"type": "text", "text": string}', 'text parts {"type": "text", "text": string}'),
    "StreamOptions": ("stream options object", "stream options objects"),
    "ResponseFormat": ("response format object", "response format objects"),
}


def object_words(model: type[BaseModel], path: tuple) -> tuple[str, str] | None:
    """(noun, allowed) for the request-model object at ``path`` of ``model``, for a value that is no object:
    ``("a chat message", 'an object with "role" and "content", optionally "name"')``; the allowed words end in
    ``, or null`` when the field may be null. None when the field is no object with declared fields."""
    root = _schema(model)
    leaves = list(_leaves(root, root, tuple(path)))
    objects = [leaf for leaf in leaves if leaf.get("type") == "object" and leaf.get("properties")]
    if len(objects) != 1:
        return None
    leaf = objects[0]
    required = [json.dumps(name) for name in leaf.get("required", [])]
    optional = [json.dumps(name) for name in leaf["properties"] if json.dumps(name) not in required]
    words = "an object with " + (
        _and(required) + (", optionally " + _and(optional) if optional else "")
        if required
        else "optional " + _and(optional)
    )
    nullable = any(member.get("type") == "null" for member in leaves)
    return _noun(root, leaf), words + (", or null" if nullable else "")


def _and(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def required_words(model: type[BaseModel], path: tuple) -> str | None:
    """What the field at ``path`` of ``model`` may be, every member of its union as a noun: ``a string, a list
    of strings, or null``, ``a non-empty list of chat messages``; for a missing field's or a value that is none
    of the union's members. None for a path the schema does not have."""
    root = _schema(model)
    nouns = list(dict.fromkeys(_noun(root, leaf) for leaf in _leaves(root, root, tuple(path))))
    if not nouns:
        return None
    return nouns[0] if len(nouns) == 1 else ", ".join(nouns[:-1]) + ", or " + nouns[-1]
