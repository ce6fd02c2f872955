"""The request body limit (``--max-request-body-bytes``), enforced while the body is read.

An ASGI middleware: a ``Content-Length`` over the limit is answered 413 before a byte of the body is read; a
body without one (chunked transfer) is counted as it arrives, and the chunk that passes the limit ends the
reading with the same 413 (``BodyTooLarge``, raised from ``receive``: FastAPI re-raises an HTTPException met
while reading, and the server's handler writes it). Nothing past the limit is kept: uvicorn hands the body over
in chunks of at most 64 KiB. The 413 closes the connection (``Connection: close``); the connection drops, unparsed,
what the client still sends for a moment before it closes (``connection.LINGER_S``), so that the client reads
the 413. The 413 is OpenAI's error body, ``code`` ``request_body_too_large``, the message naming the limit and its
flag.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException

from attnserve.entrypoints.openai.errors import error_response

# 8 MiB: a prompt of 131,072 tokens (the longest context of common models) as token ids (at most 7 bytes each in
# JSON) or as text of up to 64 bytes per token
DEFAULT_MAX_REQUEST_BODY_BYTES = 8 * 1024 * 1024
CODE = "request_body_too_large"


def too_large_message(limit: int, sent: int | None = None) -> str:
    """``the request body has more than 8388608 bytes (allowed: at most 8388608, --max-request-body-bytes)``."""
    size = f"{sent} bytes" if sent is not None else f"more than {limit} bytes"
    return f"the request body has {size} (allowed: at most {limit}, --max-request-body-bytes)"


class BodyTooLarge(HTTPException):
    """Raised from ``receive`` once the body passes the limit; the server's handler answers it (413)."""

    code = CODE

    def __init__(self, limit: int, sent: int | None = None) -> None:
        super().__init__(413, too_large_message(limit, sent), headers={"connection": "close"})


class RequestBodyLimit:
    """ASGI middleware: HTTP request bodies of at most ``max_bytes`` bytes (None: no limit)."""

    def __init__(self, app, max_bytes: int | None) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send) -> None:
        limit = self.max_bytes
        if scope["type"] != "http" or limit is None:
            return await self.app(scope, receive, send)
        declared = _content_length(scope)
        if declared is not None and declared > limit:  # refused unread; uvicorn discards what the client sends
            response = error_response(
                too_large_message(limit, declared), 413, code=CODE, headers={"connection": "close"}
            )
            return await response(scope, receive, send)
        received = 0

        async def counting_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(limit)
            return message

        await self.app(scope, counting_receive, send)


def _content_length(scope) -> int | None:
    for name, value in scope.get("headers") or ():
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
