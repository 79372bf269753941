"""Requests read by trtkv.bench.transport.http1's strict parser: the bytes of a request
(http_request), a streamed event's JSON object (event_json), and one bounded request and answer with
its own socket (fetch; `strict`, the same as trtkv.core.httpcall's transport), for the bench's small
requests: readiness checks, model lists, the fidelity task's served calls."""

from __future__ import annotations

import functools
import json
import socket
import threading
import time
from typing import Any

from trtkv.bench.transport.http1 import Call, Connection, Limits, ProtocolError
from trtkv.contracts.bench_doc import RequestRecord
from trtkv.core.httpcall import Transport


def event_json(payload: bytes) -> dict[str, Any]:
    """One streamed event's JSON object; anything else is the server's protocol error, named with
    the event's start."""
    try:
        event = json.loads(payload)
    except ValueError as exc:
        raise ProtocolError(f"a streamed event is not JSON ({exc}): {payload[:80]!r}") from None
    if not isinstance(event, dict):
        raise ProtocolError(f"a streamed event is not a JSON object: {payload[:80]!r}")
    return event


def http_request(
    method: str, host: str, port: int, path: str, body: bytes, headers: dict[str, str]
) -> bytes:
    """The bytes of one HTTP/1.1 request with a body (keep-alive, no compression); ValueError for a
    path or header that would break the request line (a CR, LF or NUL from a --model name or an API
    key)."""
    if (
        any(c in text for text in (path, *headers, *headers.values()) for c in "\r\n\0")
        or " " in path
    ):
        raise ValueError(f"a request path or header holds a space, CR, LF or NUL: {path[:80]!r}")
    lines = [
        f"{method} {path} HTTP/1.1",
        f"Host: {host}:{port}",
        "Accept-Encoding: identity",
        f"Content-Length: {len(body)}",
        *(f"{k}: {v}" for k, v in headers.items()),
        "",
        "",
    ]
    return "\r\n".join(lines).encode("latin-1") + body


# a readiness or model-list answer: a few KB (a server listing thousands of models: < 1 MB)
CHECK_BYTES = 4 << 20


class _Collected(Call):
    """A Call that keeps its (bounded) body instead of handing event-stream lines to Events."""

    def __init__(self, request: bytes, limits: Limits, expect_type: bytes | None) -> None:
        record = RequestRecord("check", "check", "", 0, 0, 0)
        super().__init__(
            Connection("", 0),
            request,
            record,
            _NoEvents(),
            0.0,
            threading.Event(),
            limits,
            expect_type,
        )
        self.body = bytearray()

    def _body(self, data: bytes, t_ns: int) -> None:
        self.body += data


class _NoEvents:
    def on_line(self, line: bytes, t_ns: int) -> bool:
        return False

    def on_end(self, t_ns: int) -> None:
        return None

    def decode(self) -> None:
        return None


def fetch(
    host: str,
    port: int,
    method: str,
    path: str,
    body: bytes,
    headers: dict[str, str],
    timeout_s: float,
    max_bytes: int = CHECK_BYTES,
    expect_type: bytes | None = b"application/json",
) -> tuple[int, bytes]:
    """One request (Connection: close) and its (status, body), within ONE deadline of `timeout_s`
    for connecting, sending and the whole answer (a server dripping a byte a second cannot hold it
    longer) and at most `max_bytes` of body; a 200 answer must be `expect_type` without a content
    coding. TimeoutError, OSError or ProtocolError."""
    deadline = time.monotonic() + timeout_s
    request = http_request(
        method,
        host,
        port,
        path,
        body,
        {"Connection": "close", "Accept": "application/json", **headers},
    )
    call = _Collected(request, Limits(body_bytes=max_bytes), expect_type)
    try:
        with socket.create_connection(
            (host, port), timeout=max(0.001, deadline - time.monotonic())
        ) as sock:
            sock.sendall(request)
            while not _fetched(call, sock, deadline):
                pass
    except TimeoutError:
        raise TimeoutError(f"no whole answer within {timeout_s:g} s") from None
    return call.status, bytes(call.body)


def strict(expect_type: bytes | None = b"application/json") -> Transport:
    """`fetch` as trtkv.core.httpcall's transport: the bench's small requests read by this strict
    parser too."""
    return functools.partial(fetch, expect_type=expect_type)


def _fetched(call: _Collected, sock: socket.socket, deadline: float) -> bool:
    """Read once (at most until the deadline); True when the answer is complete."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    sock.settimeout(left)
    data = sock.recv(65536)
    if not data:
        if call.status and call.body_mode == "close":
            return True
        raise ProtocolError("the server closed the connection before the end of its answer")
    return call.feed(data, 0)
