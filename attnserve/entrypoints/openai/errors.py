"""Errors in OpenAI's format: an exception carrying the HTTP status, and the JSON body it becomes."""

from __future__ import annotations

from http import HTTPStatus

from fastapi.responses import JSONResponse

from attnserve.entrypoints.openai.protocol import ErrorInfo, ErrorResponse
from attnserve.refusals import Refusal, json_value, openai_error  # noqa: F401 (json_value re-exported)
from attnserve.refusals.server import (  # noqa: F401 (re-exported)
    body_message,
    json_error_message,
    validation_message,
    validation_refusals,
)

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


def error_response(
    message: str, status: int, param: str | None = None, code: str | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(error_body(message, status, param, code).model_dump(), status_code=status, headers=headers)


def status_phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "error"


def refusal_error(refusal: Refusal, param: str | None = None) -> OpenAIError:
    """The 400 for a refusal: :func:`attnserve.refusals.openai_error`'s message and param (``param`` when given)."""
    message, param = openai_error(refusal, param)
    return OpenAIError(message, 400, param=param)
