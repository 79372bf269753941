"""Just enough HTTP/1.1 for streamed answers, without the socket: the request bytes, and a parser that takes the
response in whatever pieces TCP delivers (status and headers; chunked, Content-Length or until-close bodies) and
hands each server-sent-event line to the protocol's Events. The socket work is trtkv.bench.stream's loop."""

from __future__ import annotations

import socket
import threading
import time
from typing import Protocol

from trtkv.bench.records import ERROR, RequestRecord

ERROR_BODY_BYTES = 4096  # enough of a non-200 answer to quote it
MAX_HEADER_BYTES = 65536


class Events(Protocol):
    """What a protocol does with the events of one streamed response."""

    def on_line(self, line: bytes, t_ns: int) -> bool:
        """One line of the event stream (without its newline); True when the request has finished (ok or not)."""

    def on_end(self, t_ns: int) -> None:
        """The response body ended without on_line having finished the request."""

    def decode(self) -> None:
        """After the request (in the worker thread): turn what on_line kept into the record's texts."""


class Connection:
    """One keep-alive connection carrying one request at a time (a session owns it; only the loop thread reads
    and writes it while a request is in flight)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.sock: socket.socket | None = None
        self.requests = 0  # completed on this socket: a reused socket may have been closed by the server meanwhile
        self.call: Call | None = None

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
            self.sock = None


class Call:
    """One request in flight and its response parser."""

    def __init__(self, conn: Connection, request: bytes, record: RequestRecord, events: Events, timeout_s: float,
                 done: threading.Event) -> None:
        self.conn, self.request, self.record, self.events = conn, request, record, events
        self.timeout_s, self.done = timeout_s, done
        self.deadline = time.monotonic() + timeout_s
        self.sent = 0
        self.retried = False
        self.received = False  # any byte of the response
        self.finished = False  # the record has its final status (the body may still be draining)
        self.head = bytearray()
        self.status = 0
        self.body_mode = ""  # "chunked", "length", "close"
        self.keep_alive = True
        self.left = 0  # bytes left in the current chunk, or of a Content-Length body
        self.chunk_state = "size"  # size, data, crlf, trailer
        self.raw = bytearray()  # undecoded body bytes (chunk framing)
        self.tail = b""  # an incomplete event-stream line
        self.error_body = bytearray()

    # -- results ------------------------------------------------------------------------------------------------
    def fail(self, status: str, error: str, t_ns: int) -> None:
        if not self.finished:
            self.record.status, self.record.error, self.record.end_ns = status, error, t_ns
            self.finished = True

    # -- body decoding ------------------------------------------------------------------------------------------
    def feed(self, data: bytes, t_ns: int) -> bool:
        """Response bytes; True when the response is complete (the connection can carry the next request)."""
        self.received = True
        if not self.status:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                if len(self.head) > MAX_HEADER_BYTES:
                    raise ProtocolError(f"no end of the response headers within {MAX_HEADER_BYTES} bytes")
                return False
            self._parse_head(bytes(self.head[:end]))
            data = bytes(self.head[end + 4:])
            self.head = bytearray()
        if self.body_mode == "chunked":
            return self._feed_chunked(data, t_ns)
        if self.body_mode == "length":
            data = data[:self.left]
            self.left -= len(data)
            self._body(data, t_ns)
            return self.left <= 0
        self._body(data, t_ns)  # until close
        return False

    def _parse_head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        parts = lines[0].split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
            raise ProtocolError(f"not an HTTP response: {lines[0][:80]!r}")
        self.status = int(parts[1])
        headers: dict[bytes, bytes] = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        self.keep_alive = parts[0] != b"HTTP/1.0" and headers.get(b"connection", b"").lower() != b"close"
        if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
            self.body_mode = "chunked"
        elif b"content-length" in headers:
            self.body_mode, self.left = "length", int(headers[b"content-length"])
        else:
            self.body_mode, self.keep_alive = "close", False

    def _feed_chunked(self, data: bytes, t_ns: int) -> bool:
        """Strip the chunk framing (sizes may be split anywhere across reads); True at the final empty chunk."""
        if self.raw:
            data = bytes(self.raw) + data
            self.raw.clear()
        pos, n = 0, len(data)
        out: list[bytes] = []
        complete = False
        while pos < n:
            state = self.chunk_state
            if state == "data":
                end = pos + self.left
                if end > n:
                    out.append(data[pos:])
                    self.left = end - n
                    pos = n
                    break
                out.append(data[pos:end])
                pos, self.left, self.chunk_state = end, 0, "crlf"
                continue
            end = data.find(b"\r\n", pos)
            if end < 0:
                break
            line = data[pos:end]
            pos = end + 2
            if state == "size":
                try:
                    size = int(line.split(b";", 1)[0], 16)
                except ValueError:
                    raise ProtocolError(f"bad chunk size line {line[:40]!r}") from None
                self.chunk_state, self.left = ("data", size) if size else ("trailer", 0)
            elif state == "crlf":
                if line:
                    raise ProtocolError("a chunk did not end with CRLF")
                self.chunk_state = "size"
            elif not line:  # trailer: an empty line ends the body
                complete = True
                break
        if pos < n and not complete:
            self.raw += data[pos:]
        if out:
            self._body(out[0] if len(out) == 1 else b"".join(out), t_ns)
        return complete

    def _body(self, data: bytes, t_ns: int) -> None:
        if not data or self.finished:
            return
        if self.status != 200:
            self.error_body += data[:ERROR_BODY_BYTES - len(self.error_body)]
            return
        lines = (self.tail + data).split(b"\n") if self.tail else data.split(b"\n")
        self.tail = lines.pop()
        on_line = self.events.on_line
        for line in lines:
            if line and on_line(line[:-1] if line[-1] == 13 else line, t_ns):  # 13: a CR before the LF
                self.finished = True
                return

    def end_of_body(self, t_ns: int) -> None:
        """The whole response has arrived (or the server closed an until-close body)."""
        if self.finished:
            return
        if self.status != 200:
            detail = self.error_body.decode(errors="replace")[:300]
            self.fail(ERROR, f"HTTP {self.status}: {detail}", t_ns)
            return
        if self.tail and self.events.on_line(self.tail.rstrip(b"\r"), t_ns):
            self.finished = True
            return
        self.events.on_end(t_ns)
        self.finished = True


class ProtocolError(Exception):
    pass


def http_request(method: str, host: str, port: int, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    """The bytes of one HTTP/1.1 request with a body (keep-alive, no compression)."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}", "Accept-Encoding: identity",
             f"Content-Length: {len(body)}", *(f"{k}: {v}" for k, v in headers.items()), "", ""]
    return "\r\n".join(lines).encode("latin-1") + body
