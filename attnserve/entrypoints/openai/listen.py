"""The server's listening socket: bound once, before anything slow, and handed to uvicorn as it is.

``attnserve serve`` binds it right after reading its flags, before it reads the model's config or loads
anything, so that an address in use is one line and exit status 1 at once, not uvicorn's error once the model
has loaded. The socket listens at once: on Linux two sockets with SO_REUSEADDR may both bind one port while
neither listens, and the second to listen would fail later, in uvicorn, with a traceback; a listening socket
holds the port, and the other process's bind (or listen) fails here with the same one line. uvicorn then
accepts on that same socket (``uvicorn.Server.run(sockets=[sock])``); connections made while the model's
config is checked wait in the backlog.
"""

from __future__ import annotations

import errno
import socket

# errno -> what to do about it, after the OS's reason
_HINTS = {
    errno.EADDRINUSE: "another server is running there? pick another port with --port, or --port 0 for a free one",
    errno.EADDRNOTAVAIL: "no network interface of this machine has that address; pick one with --host, e.g. "
    "127.0.0.1, or 0.0.0.0 for all",
}


BACKLOG = 2048  # uvicorn's default


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (port 0: a free one) and listening; uvicorn accepts on it.
    Raises OSError: the port is in use (by a socket that listens, or one bound that listens first), the address
    is not this machine's, the host name does not resolve (``socket.gaierror``), a port below 1024 without the
    privilege."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET  # as uvicorn chooses it
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: restart past TIME_WAIT
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


def cannot_listen_message(host: str, port: int, error: OSError) -> str:
    """The error line's text for a socket ``bind_socket`` could not bind: the address, the OS's reason and what
    to do, e.g. ``cannot listen on 127.0.0.1:8000: Address already in use (another server is running there? pick
    another port with --port, or --port 0 for a free one)``."""
    reason = error.strerror or str(error)
    if isinstance(error, socket.gaierror):
        hint = "not a host name this machine resolves; pick an address with --host, e.g. 127.0.0.1"
    elif error.errno == errno.EACCES and 0 < port < 1024:
        hint = "ports below 1024 need privileges; pick a higher one with --port"
    else:
        hint = _HINTS.get(error.errno)
    return f"cannot listen on {host}:{port}: {reason}" + (f" ({hint})" if hint else "")
