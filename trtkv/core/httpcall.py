"""trtkv's own small HTTP requests (a readiness poll, a model list, a one-token canary, a generate,
a /metrics read): one helper with one deadline for the whole exchange, a bound on the answer's
bytes, the API key's headers and no proxy (trtkv's servers are on loopback or a named host, reached
directly, whatever `http_proxy` says).

The streamed benchmark requests are not these: trtkv.bench's own HTTP/1.1 parser reads them (and, as
`transport`, the bench's small requests too, so the bench trusts no parser but its own strict one).
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trtkv.core.apikey import auth_headers

DEFAULT_HOST = "127.0.0.1"  # an address without a host ("":8000) is this machine's loopback
# a ready answer, a one-token inference or a model list: a few hundred bytes to a few KB
DEFAULT_MAX_BYTES = 1 << 20

# (host, port, method, path, body, headers, timeout_s, max_bytes) -> (status, body): one request,
# one deadline
Transport = Callable[[str, int, str, str, bytes, dict[str, str], float, int], tuple[int, bytes]]


class HttpError(OSError):
    """A request that got no usable answer: a bad URL, no whole answer within its deadline, an
    answer larger than its bound or not HTTP. An OSError, like the connection errors (refused,
    unreachable) that pass through as they are."""


@dataclass(frozen=True)
class Answer:
    """A whole HTTP answer: its status and its body (at most the request's max_bytes)."""

    status: int
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode(errors="replace")


@dataclass(frozen=True)
class Target:
    """Where a request goes: `http://host:port/path` or `host:port/path` (no scheme; `[::1]:8000`
    for IPv6; no host: DEFAULT_HOST; no port: 80)."""

    host: str
    port: int
    path: str

    @classmethod
    def parse(cls, url: str) -> Target:
        """HttpError for a scheme other than http, a bad port, or a CR/LF/NUL/space in the URL. The
        path is sent as written (no query or fragment split: a model name is part of it)."""
        if any(c in url for c in "\r\n\0 "):
            raise HttpError(f"the URL {url[:120]!r} holds a space, CR, LF or NUL")
        scheme, sep, rest = url.partition("://")
        if not sep:
            scheme, rest = "http", url
        if scheme.lower() != "http":
            raise HttpError(
                f"the URL {url[:120]!r} is not http:// (trtkv's own requests speak plain HTTP to a "
                "server it reaches directly)"
            )
        authority, slash, path = rest.partition("/")
        parts = urllib.parse.urlsplit(f"//{authority}")
        try:
            port = parts.port or 80
        except ValueError:
            raise HttpError(f"the URL {url[:120]!r} has no valid port (1-65535)") from None
        return cls(parts.hostname or DEFAULT_HOST, port, slash + path or "/")


def request(
    url: str,
    body: dict[str, Any] | list[Any] | None = None,
    *,
    timeout_s: float,
    max_bytes: int = DEFAULT_MAX_BYTES,
    method: str | None = None,
    transport: Transport | None = None,
) -> Answer:
    """One request to `url` (GET, or POST with `body` as JSON), the API key's headers when one is
    set, within ONE deadline of `timeout_s` for connecting, sending and the whole answer, and at
    most `max_bytes` of answer. `transport` replaces the standard library's client (the bench passes
    its strict parser; its errors pass as they are). Raises OSError: HttpError, or the connection's
    own (refused, reset, unreachable)."""
    target = Target.parse(url)
    data = b"" if body is None else json.dumps(body).encode()
    headers = (
        {"Content-Type": "application/json", **auth_headers()}
        if body is not None
        else auth_headers()
    )
    verb = method or ("GET" if body is None else "POST")
    send = transport or _stdlib
    status, raw = send(
        target.host, target.port, verb, target.path, data, headers, timeout_s, max_bytes
    )
    return Answer(status, raw)


def _stdlib(
    host: str,
    port: int,
    method: str,
    path: str,
    body: bytes,
    headers: dict[str, str],
    timeout_s: float,
    max_bytes: int,
) -> tuple[int, bytes]:
    """http.client under one deadline (a timer shuts the socket under a blocked read: a server
    dripping a byte at a time cannot stretch it) and a byte bound; a body shorter than its
    Content-Length is an error, not a short read."""
    url = f"http://{host}:{port}{path}"
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        sock = conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    timer = threading.Timer(timeout_s, expire)
    timer.daemon = True
    timer.start()
    try:
        conn.request(method, path, body=body if body or method != "GET" else None, headers=headers)
        response = conn.getresponse()
        raw = response.read(max_bytes + 1)
        if expired.is_set():
            raise HttpError(f"no whole answer from {url} within {timeout_s:g} s")
        if len(raw) <= max_bytes and response.length:  # read(n) returns a short body without a word
            raise HttpError(
                f"the answer from {url} ended {response.length} bytes before its Content-Length"
            )
        if len(raw) > max_bytes:
            raise HttpError(f"the answer from {url} is larger than {max_bytes} bytes")
        return response.status, raw
    except HttpError:
        raise
    except (OSError, http.client.HTTPException, ValueError) as exc:
        if expired.is_set():
            raise HttpError(f"no whole answer from {url} within {timeout_s:g} s") from None
        if isinstance(exc, OSError):
            raise
        raise HttpError(f"{type(exc).__name__}: {exc}") from None
    finally:
        timer.cancel()
        conn.close()
