"""Errors in OpenAI's format: an exception carrying the HTTP status, and the JSON body it becomes."""

from __future__ import annotations

from http import HTTPStatus

from fastapi.responses import JSONResponse

from attnserve.entrypoints.openai.protocol import ErrorInfo, ErrorResponse

# HTTP status -> OpenAI's error "type"
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    500: "internal_server_error",
    503: "service_unavailable",
}


class OpenAIError(Exception):
    """A request the server answers with an error body; ``status`` is the HTTP status."""

    def __init__(self, message: str, status: int = 400, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code

    def body(self) -> ErrorResponse:
        return error_body(self.message, self.status, self.param, self.code)


def error_body(message: str, status: int, param: str | None = None, code: str | None = None) -> ErrorResponse:
    kind = _TYPES.get(status) or ("invalid_request_error" if status < 500 else "internal_server_error")
    return ErrorResponse(error=ErrorInfo(message=message, type=kind, param=param, code=code))


def error_response(message: str, status: int, param: str | None = None, code: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, status, param, code).model_dump(), status_code=status, headers=headers)


# pydantic's names for the members of a union in an error's location ("str", "list[str]", "list[constrained-int]"):
# never a request field's name
_PLAIN_TYPES = {"str", "int", "float", "bool", "list", "dict", "none"}


def _union_member(part) -> bool:
    return isinstance(part, str) and (part in _PLAIN_TYPES or "[" in part or "-" in part)


def _is_type_mismatch(err: dict) -> bool:
    return err.get("type", "").endswith(("_type", "_parsing"))


def validation_message(errors: list[dict]) -> tuple[str, str | None]:
    """(message, param) for pydantic's ``errors()`` of a request body: ``field.sub: msg`` per field, at most 5,
    param the first field's path. A field typed as a union (``prompt``: a string, strings, token ids or lists of
    token ids) fails once per member; its errors become one: the deepest member's error that is not a plain type
    mismatch (``prompt.0: Input should be greater than or equal to 0``), else ``stop: 5 is none of str,
    list[str]``."""
    fields: dict[tuple, list[tuple[tuple, dict]]] = {}  # top-level field -> (path without union members, error)
    for err in errors:
        path = tuple(x for x in err.get("loc", ()) if x != "body")
        bare = tuple(x for x in path if not _union_member(x))
        fields.setdefault(bare[:1], []).append((bare, err))
    parts = []
    for group in fields.values():
        unions = [e for e in group if any(_union_member(x) for x in e[1].get("loc", ()))]
        if len(unions) < 2:
            parts += [(".".join(map(str, bare)) or "body", err.get("msg")) for bare, err in group]
            continue
        depth = max(len(bare) for bare, _ in unions)
        deepest = [(bare, err) for bare, err in unions if len(bare) == depth and not _is_type_mismatch(err)]
        if deepest:
            bare, err = deepest[0]
            parts.append((".".join(map(str, bare)), err.get("msg")))
        else:
            members = list(dict.fromkeys(next(x for x in e.get("loc", ()) if _union_member(x)) for _, e in unions))
            bare = unions[0][0][:1]
            parts.append((".".join(map(str, bare)), f"{unions[0][1].get('input')!r} is none of {', '.join(members)}"))
    message = "; ".join(f"{where}: {msg}" for where, msg in parts[:5])
    return message or "invalid request", (parts[0][0] if parts and parts[0][0] != "body" else None)


def status_phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "error"
