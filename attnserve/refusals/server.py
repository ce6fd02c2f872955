"""The server's refusals of a request body: pydantic's validation errors as Refusal records, in the words the
request model's schema says (:mod:`attnserve.refusals.schema`), and the body that is no JSON object at all."""

from __future__ import annotations

import math

from pydantic import BaseModel

from attnserve.refusals import JSON, MISSING, Refusal, dotted_path, json_value, openai_error
from attnserve.refusals.schema import allowed_values, object_words, required_words


# pydantic's names for the members of a union in an error's location ("str", "list[str]", "list[constrained-int]"):
# never a request field's name
_PLAIN_TYPES = {"str", "int", "float", "bool", "list", "dict", "none"}


def _union_member(part) -> bool:
    return isinstance(part, str) and (part in _PLAIN_TYPES or "[" in part or "-" in part)


def _member(err: dict) -> str:
    """The union member an error is about: its name in the error's location (``list[ContentPart]``)."""
    return next((x for x in err.get("loc", ()) if _union_member(x)), "")


def _is_type_mismatch(err: dict) -> bool:
    """A value of the wrong kind for a union member; a number with a fraction part for an integer member is
    not (``prompt: [1.5]`` is about the token-id member: ``1.5 is not an integer``)."""
    if err.get("type") == "int_type" and _is_float(err.get("input")):
        return False
    return err.get("type", "").endswith(("_type", "_parsing"))


def _is_float(value) -> bool:
    return isinstance(value, float)


# pydantic error type -> (the JSON schema types it is about, what the value is not)
_NOT_A = {
    "int_type": (("integer",), "an integer"),
    "int_parsing": (("integer",), "an integer"),
    "int_from_float": (("integer",), "an integer"),
    "int_parsing_size": (("integer",), "an integer"),  # a float beyond 64 bits: 1e+20
    "float_type": (("number",), "a number"),
    "float_parsing": (("number",), "a number"),
    "finite_number": (("integer", "number"), "a finite number"),
    "bool_type": (("boolean",), "a boolean"),
    "bool_parsing": (("boolean",), "a boolean"),
    "string_type": (("string",), "a string"),
}
_OUT_OF_RANGE = {"greater_than", "greater_than_equal", "less_than", "less_than_equal", "literal_error"}
# pydantic error type -> what the value is not, for a list or object field (None: the object's noun, from the
# schema); and a list or string too short. What is allowed: every member of the field in words
_NOT_A_CONTAINER = {"list_type": "a list", "dict_type": "an object", "model_type": None, "model_attributes_type": None}
_TOO_SHORT = {"too_short", "string_too_short"}


def _refusal(err: dict, path: tuple, model: type[BaseModel] | None, union: bool = False) -> Refusal:
    """The refusal of pydantic's error ``err`` at ``path`` (``()``: the body), in the words the schema of ``model``
    says for the field: ``1.5 is not an integer (allowed: integer in [1, 128])``, ``0 not allowed (allowed: integer
    >= 1, or null)``; pydantic's message else. A missing field: ``missing (required: a string, ...)``; a number no
    64-bit float holds, as sent (``1e400`` parses as infinity): ``1e400 is beyond a 64-bit float's range (allowed:
    ...)``. A list or an object where it does not belong: ``"hi" is not a list (allowed: a non-empty list of chat
    messages)``, ``1 is not a chat message (allowed: an object with "role" and "content", optionally "name", "tool_calls" and "tool_call_id")``; one
    too short: ``[] not allowed (allowed: a non-empty list of chat messages)``, ``"" not allowed (allowed: non-empty
    string)``, every member's words for a value at a ``union``'s own path."""
    kind = err.get("type", "")
    value = err.get("input")
    at = tuple(path) or ("body",)
    if kind == "missing":
        return Refusal(at, MISSING, required_words(model, path) if model is not None else None, written=JSON)
    if model is not None and kind in _NOT_A_CONTAINER:
        noun, words = _NOT_A_CONTAINER[kind], required_words(model, path)
        if noun is None:
            noun, words = object_words(model, path) or (None, None)
        if noun and words:
            return Refusal(at, value, words, noun=noun, written=JSON)
    if model is not None and kind in _TOO_SHORT:
        words = (
            required_words(model, path) if union or kind == "too_short" else allowed_values(model, path, ("string",))
        )
        if words:
            return Refusal(at, value, words, written=JSON)
    if _is_float(value) and not math.isfinite(value):  # the text as sent: 1e400, NaN, Infinity
        what = (
            "is not a number"
            if math.isnan(value)
            else "is not a finite number"
            if json_value(value).lstrip("-") == "Infinity"
            else "is beyond a 64-bit float's range"
        )
        allowed = allowed_values(model, path, ("integer", "number")) if model is not None else None
        return Refusal(at, value, allowed, reason=what, written=JSON)
    kinds, noun = _NOT_A.get(kind, (("string",) if kind == "literal_error" else ("integer", "number"), ""))
    allowed = allowed_values(model, path, kinds) if model is not None and (noun or kind in _OUT_OF_RANGE) else None
    if allowed is None:
        return Refusal(at, reason=err.get("msg", ""), written=JSON)
    return Refusal(at, value, allowed, noun=noun or None, written=JSON)


def validation_message(errors: list[dict], model: type[BaseModel] | None = None) -> tuple[str, str | None]:
    """(message, param) for pydantic's ``errors()`` of a request body: :func:`validation_refusals`, at most 5, each
    as the server writes it (``max_tokens: 1e+20 is not an integer (allowed: integer >= 1, or null)``), param the
    first field's path."""
    refusals = validation_refusals(errors, model)
    message = "; ".join(openai_error(r)[0] for r in refusals[:5])
    return message or "invalid request", (
        dotted_path(refusals[0].path) if refusals and refusals[0].path != ("body",) else None
    )


def validation_refusals(errors: list[dict], model: type[BaseModel] | None = None) -> list[Refusal]:
    """One refusal per field of pydantic's ``errors()`` of a request body. With the request ``model``, a value of the
    wrong type or out of range names what the field allows (from the model's schema). A field typed as a union
    (``prompt``: a string, strings, token ids or lists of token ids) fails once per member; its errors become one:
    the deepest member's error that is not a plain type mismatch (``prompt.0: -1 not allowed (allowed: integer >=
    0)``), or the deepest error of the one member whose shape the value has (``messages.0.content.1: 5 is not a text
    part``), else ``stop: 5 not allowed (allowed: a string, a list of strings, or null)``, at the union's own path. A
    missing field reads ``prompt: missing (required: a string, ...)``."""
    # the path up to a union's members (``messages.0.content``), else the error's own: (bare path, error) pairs
    fields: dict[tuple, list[tuple[tuple, dict]]] = {}
    for err in errors:
        path = tuple(x for x in err.get("loc", ()) if x != "body")
        bare = tuple(x for x in path if not _union_member(x))
        cut = next((i for i, x in enumerate(path) if _union_member(x)), len(path))
        fields.setdefault(path[:cut], []).append((bare, err))
    out: list[Refusal] = []
    for where, group in fields.items():
        unions = [e for e in group if any(_union_member(x) for x in e[1].get("loc", ()))]
        if len(unions) < 2:
            out += [_refusal(err, bare, model) for bare, err in group]
            continue
        depth = max(len(bare) for bare, _ in unions)
        deepest = [(bare, err) for bare, err in unions if len(bare) == depth and not _is_type_mismatch(err)]
        inside = [(bare, err) for bare, err in unions if len(bare) == depth > len(where)]
        if len({_member(err) for _, err in inside}) == 1:  # one member took the value's shape: its error, whatever
            deepest = inside  # it is (``content.1: 5 is not a text part``: only the list member looked inside)
        if deepest:
            bare, err = deepest[0]
            out.append(_refusal(err, bare, model, union=len(bare) == len(where)))
            continue
        value = unions[0][1].get("input")
        words = required_words(model, tuple(x for x in where if not _union_member(x))) if model else None
        if words is None:  # no schema: pydantic's names of the members
            names = ", ".join(dict.fromkeys(next(x for x in e.get("loc", ()) if _union_member(x)) for _, e in unions))
            out.append(Refusal(where, value, reason=f"is none of {names}", written=JSON))
        else:
            out.append(Refusal(where, value, words, written=JSON))
    return out


_JSON_KINDS = (
    (bool, "a boolean"),
    ((int, float), "a number"),
    (str, "a string"),
    (list, "an array"),
    (type(None), "null"),
)


def body_message(err: dict, content_type: str | None) -> str | None:
    """The message for a request body that is not a JSON object (pydantic's error at loc ``("body",)``), None
    for another error: an empty body; a body not sent as JSON (FastAPI parses a body as JSON only with
    ``Content-Type: application/json``; else the error's input is the raw bytes), naming the Content-Type
    sent; valid JSON of another kind, naming it (``got an array: [1]``)."""
    if tuple(err.get("loc", ())) != ("body",):
        return None
    value = err.get("input")
    if err.get("type") == "missing":
        return "the request body is empty; it must be a JSON object (sent with 'Content-Type: application/json')"
    if isinstance(value, (bytes, bytearray)):
        sent = f"'Content-Type: {content_type}'" if content_type else "no Content-Type header"
        return f"the request body must be a JSON object sent with 'Content-Type: application/json' (got {sent})"
    kind = next((k for t, k in _JSON_KINDS if isinstance(value, t)), None)
    if kind is None:
        return None
    return "the request body must be a JSON object, got " + (kind if value is None else f"{kind}: {json_value(value)}")


def json_error_message(reason: str, offset: int | None, doc: str | bytes | None) -> str:
    """Invalid JSON: ``malformed JSON body: Expecting value at line 1, column 32 (character 31)``, the position
    as Python's JSON parser counts it (line and column from 1)."""
    if not isinstance(offset, int):
        return f"malformed JSON body: {reason}"
    if isinstance(doc, (bytes, bytearray)):
        doc = doc.decode("utf-8", "replace")
    if not isinstance(doc, str):
        return f"malformed JSON body: {reason} at character {offset}"
    line = doc.count("\n", 0, offset) + 1
    column = offset - (doc.rfind("\n", 0, offset) + 1) + 1
    return f"malformed JSON body: {reason} at line {line}, column {column} (character {offset})"
