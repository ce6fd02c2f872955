"""The server's HTTP connections: uvicorn's h11 protocol with deadlines for each phase and a connection cap.

uvicorn closes an idle kept-alive connection (``timeout_keep_alive``) but has no deadline for a request's
headers or body, and none for a client that stops reading its response: a connection that sends one byte every
few seconds (slow-loris), or connects and sends nothing, stays open for ever. ``guarded_protocol`` returns the
h11 protocol class with:

- a header deadline (``--timeout-request-header``): from the connection (or a kept-alive connection's next
  byte) to the end of the request's headers; past it, a 408 and the connection closed;
- a body deadline (``--timeout-request-body``): from the end of the headers to the end of the body; past it, a
  408 (when no response has started) and the connection closed;
- a write deadline (``--timeout-write-stall``): the transport's send buffer full (the client does not read;
  the kernel keeps at most ``NOTSENT_LOWAT`` unsent bytes) for that long: the connection is dropped, which the app sees as a disconnect (a stream's request is aborted
  and its KV blocks freed);
- a cap on connections and requests in progress (``--limit-concurrency``, uvicorn's setting) answered with a
  503 in OpenAI's error format, and on the number of request headers (``--h11-max-header-count``, vLLM's flag,
  a 431). h11's own limit on the header block's bytes (``--h11-max-incomplete-event-size``) is answered with a
  431 naming it.

Every refusal here is OpenAI's error body with ``code`` naming the limit.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct
from dataclasses import dataclass

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from attnserve.entrypoints.openai.errors import error_body, error_response

logger = logging.getLogger(__name__)

# unsent bytes the kernel holds per connection (TCP_NOTSENT_LOWAT, Linux and macOS): past them the transport
# buffers, and its flow control (and the write deadline) sees a client that does not read after ~100 KiB,
# not after the megabytes of an autotuned send buffer; bytes in flight to a reading client are not limited
NOTSENT_LOWAT = 16 * 1024
# a response that ends a connection whose request body is still arriving (a 413): the connection half-closes and
# drops what arrives, unparsed, for up to this long before it closes, so that the client, still sending, reads
# the response instead of a reset (a close with unread data resets the connection), and the server does not
# parse megabytes it refused
LINGER_S = 2.0


class _LingeringTransport:
    """The connection's transport as uvicorn sees it: ``close()`` while the request's body is still arriving (or
    after h11 refused a request part way) half-closes (the response goes out, then FIN) and lets the protocol drop what arrives for ``LINGER_S``."""

    def __init__(self, transport, protocol: _GuardedH11Protocol) -> None:
        self._transport = transport
        self._protocol = protocol
        self._lingering = False

    def __getattr__(self, name):
        return getattr(self._transport, name)

    def is_closing(self) -> bool:
        return self._lingering or self._transport.is_closing()

    def close(self) -> None:
        if self._lingering or self._transport.is_closing():
            return
        # a body still arriving, or a request h11 refused part way (a header block over its limit)
        if self._protocol.conn.their_state in (h11.SEND_BODY, h11.ERROR) and self._transport.can_write_eof():
            self._lingering = True
            self._protocol.linger()
            self._transport.write_eof()
            return
        self._transport.close()


@dataclass(frozen=True)
class ConnectionLimits:
    """Deadlines in seconds (None: none) and counts (None: no cap)."""

    timeout_request_header: float | None = 10.0
    timeout_request_body: float | None = 60.0
    timeout_write_stall: float | None = 30.0
    limit_concurrency: int | None = 4096
    h11_max_header_count: int | None = 256
    h11_max_incomplete_event_size: int = 4 * 1024 * 1024


def raw_error(status: int, reason: str, message: str, code: str) -> bytes:
    """A whole HTTP/1.1 response with OpenAI's error body that closes the connection (written past h11, which may
    be in an error state)."""
    body = json.dumps(error_body(message, status, code=code).model_dump()).encode()
    return (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
        f"connection: close\r\n\r\n"
    ).encode() + body


def guarded_protocol(limits: ConnectionLimits) -> type[H11Protocol]:
    """uvicorn's h11 protocol class with ``limits`` (pass it as ``uvicorn.Config(http=...)``)."""

    class GuardedH11Protocol(_GuardedH11Protocol):
        pass

    GuardedH11Protocol.limits = limits
    return GuardedH11Protocol


class _GuardedH11Protocol(H11Protocol):
    limits: ConnectionLimits

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.limit_concurrency = None  # uvicorn's own check answers text/plain: ours answers (``_app``)
        self._app = self.app
        self.app = self._guarded_app
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._header_bytes = 0  # bytes received since the request's headers began
        self._lingering = False  # the response is out and the connection closing: what arrives is dropped

    # --- deadlines ---------------------------------------------------------------------------------
    def _arm(self, name: str, seconds: float | None, fire) -> None:
        if seconds is not None and name not in self._timers:
            self._timers[name] = self.loop.call_later(seconds, fire)

    def _disarm(self, name: str) -> None:
        timer = self._timers.pop(name, None)
        if timer is not None:
            timer.cancel()

    def connection_made(self, transport) -> None:
        super().connection_made(_LingeringTransport(transport, self))
        sock = transport.get_extra_info("socket")
        if sock is not None and hasattr(socket, "TCP_NOTSENT_LOWAT"):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT, NOTSENT_LOWAT)
            except OSError:  # not TCP (a Unix socket)
                pass
        self._arm("header", self.limits.timeout_request_header, self._header_expired)

    def connection_lost(self, exc) -> None:
        for name in list(self._timers):
            self._disarm(name)
        super().connection_lost(exc)

    def linger(self) -> None:
        """The response is out and the connection closes: drop what the client still sends, for ``LINGER_S``."""
        self._lingering = True
        for name in list(self._timers):
            self._disarm(name)
        self._timers["linger"] = self.loop.call_later(LINGER_S, self._transport_close)

    def _transport_close(self) -> None:
        self._timers.pop("linger", None)
        self.transport._transport.close()

    def eof_received(self) -> None:
        if self._lingering:  # the client has sent all it had: close now
            self._transport_close()

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return
        if self.conn.their_state is h11.IDLE:  # a request's headers (the next one on a kept-alive connection)
            self._arm("header", self.limits.timeout_request_header, self._header_expired)
            self._header_bytes += len(data)
        super().data_received(data)
        self._track_phase()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._track_phase()

    def _track_phase(self) -> None:
        state = self.conn.their_state
        if state is not h11.IDLE:
            self._disarm("header")
            self._header_bytes = 0
        if state is h11.SEND_BODY:
            self._arm("body", self.limits.timeout_request_body, self._body_expired)
        else:
            self._disarm("body")

    def _close_with(self, status: int, reason: str, message: str, code: str) -> None:
        if self.transport.is_closing():
            return
        if self.cycle is None or not self.cycle.response_started:
            self.transport.write(raw_error(status, reason, message, code))
        self.transport.close()

    def _header_expired(self) -> None:
        self._timers.pop("header", None)
        if self.conn.their_state is h11.IDLE and (self.cycle is None or self.cycle.response_complete):
            seconds = self.limits.timeout_request_header
            self._close_with(
                408,
                "Request Timeout",
                f"the request's headers did not arrive within {seconds:g} s (--timeout-request-header)",
                "timeout_request_header",
            )

    def _body_expired(self) -> None:
        self._timers.pop("body", None)
        if self.conn.their_state is h11.SEND_BODY:
            seconds = self.limits.timeout_request_body
            self._close_with(
                408,
                "Request Timeout",
                f"the request's body did not arrive within {seconds:g} s (--timeout-request-body)",
                "timeout_request_body",
            )

    def pause_writing(self) -> None:
        super().pause_writing()
        self._arm("write", self.limits.timeout_write_stall, self._write_stalled)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._disarm("write")

    def _write_stalled(self) -> None:
        self._timers.pop("write", None)
        logger.info(
            "%s did not read its response for %g s (--timeout-write-stall): connection closed",
            "%s:%d" % self.client if self.client else "a client",
            self.limits.timeout_write_stall,
        )
        sock = self.transport.get_extra_info("socket")
        if sock is not None:  # a reset, not a FIN queued behind data the client will never take (an orphan socket)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass
        self.transport.abort()  # drop what is buffered: close() would wait for a client that does not read

    # --- refusals ------------------------------------------------------------------------------------
    def send_400_response(self, msg: str) -> None:
        """h11 refused the request: OpenAI's error body instead of uvicorn's text; a 431 naming the limit when
        the header block passed ``h11_max_incomplete_event_size``."""
        limit = self.limits.h11_max_incomplete_event_size
        if self._header_bytes > limit:
            self._close_with(
                431,
                "Request Header Fields Too Large",
                f"the request's headers have more than {limit} bytes (--h11-max-incomplete-event-size)",
                "h11_max_incomplete_event_size",
            )
        else:
            self._close_with(400, "Bad Request", f"invalid HTTP request: {msg}", "invalid_http_request")

    async def _guarded_app(self, scope, receive, send) -> None:
        """The app, or a refusal: too many connections or requests in progress (this one counted), too many
        headers."""
        cap = self.limits.limit_concurrency
        if cap is not None and (len(self.connections) > cap or len(self.tasks) > cap):
            logger.warning(
                "refused a request: %d connections, %d requests in progress (--limit-concurrency %d)",
                len(self.connections),
                len(self.tasks),
                cap,
            )
            message = (
                f"the server has too many connections or requests in progress (allowed: at most {cap}, "
                "--limit-concurrency); retry later"
            )
            response = error_response(message, 503, code="limit_concurrency", headers={"connection": "close"})
            return await response(scope, receive, send)
        max_headers = self.limits.h11_max_header_count
        if max_headers is not None and len(scope.get("headers") or ()) > max_headers:
            message = (
                f"the request has {len(scope['headers'])} headers (allowed: at most {max_headers}, "
                "--h11-max-header-count)"
            )
            response = error_response(message, 431, code="h11_max_header_count", headers={"connection": "close"})
            return await response(scope, receive, send)
        return await self._app(scope, receive, send)
