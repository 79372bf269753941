"""Just enough HTTP/1.1 for streamed answers, without the socket: a parser that takes the response
in whatever pieces TCP delivers (status and headers; chunked, Content-Length or until-close bodies)
and hands each server-sent-event line to the protocol's Events. The socket work is
trtkv.bench.transport.stream's loop; the request bytes and the one-shot requests (fetch, strict) are
trtkv.bench.transport.http1_fetch's.

The parser is strict and bounded, because a server's bytes are untrusted: a chunk size is 1*HEXDIG
(no sign, space, `0x`, `_` or overflow), Content-Length is 1*DIGIT and one value, Content-Length
with Transfer-Encoding or any coding but `chunked` is refused; the head, a chunk-size line, the
trailer, an event-stream line and the body each have a byte bound (Limits), and every read costs
time linear in its bytes (a partial line is appended to, never re-copied). Anything else raises
ProtocolError, which the loop books as that request's failure.

Why not h11 (the sans-IO parser under httpx/httpcore): benchmarks/client_cost.py (concurrency 8;
16x40 and 64x200 events; each run twice, interleaved with today's parser) gave 97-135 us of client
CPU per streamed event with an h11-based Call against 60-78 us without: +40-70 %, far past the 10 %
allowed. Its per-event state machine is the cost: parsing alone takes about 14 us per event with
h11, 3.9 us here (3.4 us before these checks).
"""

from __future__ import annotations

import re
import socket
import threading
import time
from dataclasses import dataclass
from typing import Protocol

from trtkv.contracts.bench_doc import ERROR, RequestRecord

ERROR_BODY_BYTES = 4096  # enough of a non-200 answer to quote it
# what a streamed answer is (Triton's generate_stream, every OpenAI server)
EVENT_STREAM = b"text/event-stream"
# 1xx answers before the response (each one re-scans the rest of the read: a few only)
MAX_INTERIM = 8


@dataclass(frozen=True)
class Limits:
    """Byte bounds on what one response may make the parser hold or read."""

    header_bytes: int = 65536  # status line and headers; also a chunked body's trailer
    line_bytes: int = 1 << 20  # one event-stream line (an event with logprobs can be large)
    chunk_line_bytes: int = 4096  # one chunk-size line, extensions included
    # one response body, framing included (the events keep its lines until decode)
    body_bytes: int = 64 << 20


LIMITS = Limits()
_STATUS = re.compile(rb"HTTP/1\.([01]) ([1-9][0-9]{2})(?:[ \t][^\r\n]*)?")
# a header name (no regex over values: no backtracking)
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# RFC 9112 7.1: chunk-size [ chunk-ext ]
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,16})[ \t]*(?:;[^\r\n]*)?")
_CHUNK_HEAD = re.compile(_CHUNK_SIZE.pattern + rb"\r\n")
_DIGITS = re.compile(rb"[0-9]{1,18}")


class Events(Protocol):
    """What a protocol does with the events of one streamed response."""

    def on_line(self, line: bytes, t_ns: int) -> bool:
        """One line of the event stream (without its newline); True when the request has finished
        (ok or not)."""

    def on_end(self, t_ns: int) -> None:
        """The response body ended without on_line having finished the request."""

    def decode(self) -> None:
        """After the request (in the worker thread): turn what on_line kept into the record's
        texts."""


class Connection:
    """One keep-alive connection carrying one request at a time (a session owns it; only the loop
    thread reads and writes it while a request is in flight)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.sock: socket.socket | None = None
        # completed on this socket: a reused socket may have been closed by the server meanwhile
        self.requests = 0
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

    def __init__(
        self,
        conn: Connection,
        request: bytes,
        record: RequestRecord,
        events: Events,
        timeout_s: float,
        done: threading.Event,
        limits: Limits = LIMITS,
        expect_type: bytes | None = EVENT_STREAM,
    ) -> None:
        self.conn, self.request, self.record, self.events = conn, request, record, events
        self.timeout_s, self.done, self.limits = timeout_s, done, limits
        self.expect_type = expect_type  # the media type a 200 answer must have (None: any)
        # bytes arrived after the end of the response: the connection is not reused
        self.extra = False
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
        self.body_bytes = 0  # of the body so far, framing included
        self.chunk_state = "size"  # size, data, cr, lf (the CRLF after a chunk's data), trailer
        self.trailer_bytes = 0
        self.interim = 0  # 1xx answers skipped
        self.raw = bytearray()  # an incomplete chunk-size or trailer line
        self.tail = bytearray()  # an incomplete event-stream line
        self.error_body = bytearray()

    # -- results
    # ----------------------------------------------------------------------------------------------
    def fail(self, status: str, error: str, t_ns: int) -> None:
        if not self.finished:
            self.record.status, self.record.error, self.record.end_ns = status, error, t_ns
            self.finished = True

    # -- body decoding
    # ------------------------------------------------------------------------------------------
    def feed(self, data: bytes, t_ns: int) -> bool:
        """Response bytes; True when the response is complete (the connection can carry the next
        request)."""
        self.received = True
        while not self.status:
            searched = max(0, len(self.head) - 3)
            self.head += data
            end = self.head.find(b"\r\n\r\n", searched)
            if end < 0:
                if len(self.head) > self.limits.header_bytes:
                    raise ProtocolError(
                        f"no end of the response headers within {self.limits.header_bytes} bytes"
                    )
                return False
            if end > self.limits.header_bytes:
                raise ProtocolError(f"response headers over {self.limits.header_bytes} bytes")
            data = bytes(self.head[end + 4 :])
            self._parse_head(bytes(self.head[:end]))
            self.head = bytearray()
        if self.body_mode == "length":  # Content-Length is within the body bound already
            # bytes after the response: nobody asked for them, the socket is not reused
            if len(data) > self.left:
                self.extra, data = True, data[: self.left]
            self.left -= len(data)
            self.body_bytes += len(data)
            self._body(data, t_ns)
            return self.left <= 0
        self.body_bytes += len(data)
        if self.body_bytes > self.limits.body_bytes:
            raise ProtocolError(f"a response body over {self.limits.body_bytes} bytes")
        if self.body_mode == "chunked":
            return self._feed_chunked(data, t_ns)
        self._body(data, t_ns)  # until close
        return False

    def _parse_head(self, head: bytes) -> None:
        """The status line and headers; an interim 1xx answer is skipped (the final one follows)."""
        lines = head.split(b"\r\n")
        status = _STATUS.fullmatch(lines[0])
        if status is None:
            raise ProtocolError(f"not an HTTP response: {lines[0][:80]!r}")
        code = int(status[2])
        if 100 <= code < 200:
            self.interim += 1
            if code == 101 or self.interim > MAX_INTERIM:
                raise ProtocolError(
                    f"interim answer {code} where the response was expected (no 101, at most "
                    f"{MAX_INTERIM} 1xx answers)"
                )
            return
        lengths: set[bytes] = set()
        codings: list[bytes] = []
        connection, media, encoding = b"", b"", b""
        for line in lines[1:]:
            if line[:1] in (b" ", b"\t"):
                raise ProtocolError(f"a folded header line (obsolete, refused): {line[:80]!r}")
            name, colon, value = line.partition(b":")
            if not colon or _TOKEN.fullmatch(name) is None:
                raise ProtocolError(f"not a header line: {line[:80]!r}")
            name, value = name.lower(), value.strip(b" \t")
            if name == b"content-length":
                lengths.update(v.strip() for v in value.split(b","))
            elif name == b"transfer-encoding":
                codings += [v.strip().lower() for v in value.split(b",")]
            elif name == b"connection":
                connection = value.lower()
            elif name == b"content-type":
                media = value.split(b";", 1)[0].strip().lower()
            elif name == b"content-encoding":
                encoding = value.lower()
        self.keep_alive = status[1] == b"1" and connection != b"close"
        if codings and lengths:
            raise ProtocolError(
                "both Transfer-Encoding and Content-Length (a response has one framing)"
            )
        if codings:
            if codings != [b"chunked"]:
                raise ProtocolError(
                    f"Transfer-Encoding {b', '.join(codings)[:80]!r} is not supported (only "
                    "chunked)"
                )
            self.body_mode = "chunked"
        elif code in (204, 304):
            self.body_mode, self.left = "length", 0
        elif lengths:
            value = lengths.pop()
            if lengths or _DIGITS.fullmatch(value) is None:
                raise ProtocolError(
                    f"bad Content-Length {b', '.join([value, *lengths])[:80]!r} (one 1*DIGIT value)"
                )
            self.body_mode, self.left = "length", int(value)
            if self.left > self.limits.body_bytes:
                raise ProtocolError(
                    f"Content-Length {self.left} is over the body bound of "
                    f"{self.limits.body_bytes} bytes"
                )
        else:
            self.body_mode, self.keep_alive = "close", False
        if code == 200:
            self._check_media(media, encoding)
        self.status = code

    def _check_media(self, media: bytes, encoding: bytes) -> None:
        """A 200 answer is the protocol's only in its media type, without a content coding (we asked
        for identity)."""
        if encoding not in (b"", b"identity"):
            raise ProtocolError(
                f"a 200 answer with Content-Encoding {encoding[:40].decode('latin-1')!r} (the "
                "request asked for identity)"
            )
        if self.expect_type is not None and media != self.expect_type:
            raise ProtocolError(
                f"a 200 answer with Content-Type {media[:60].decode('latin-1') or '(none)'!r}, not "
                f"{self.expect_type.decode()} (not the protocol's answer)"
            )

    def _line(self, data: bytes, pos: int, limit: int, what: str) -> tuple[bytes | None, int]:
        """The next CRLF-ended line of (self.raw + data[pos:]) and the position after it; (None,
        len(data)) when it is not complete yet: the part kept in self.raw, at most `limit` bytes."""
        raw = self.raw
        # the CRLF split between two reads
        if raw and raw[-1] == 13 and pos < len(data) and data[pos] == 10:
            line = bytes(raw[:-1])
            raw.clear()
            return line, pos + 1
        end = data.find(b"\r\n", pos)
        if end < 0:
            if len(raw) + len(data) - pos > limit:
                raise ProtocolError(f"a {what} over {limit} bytes")
            raw += data[pos:]
            return None, len(data)
        line = bytes(raw) + data[pos:end] if raw else data[pos:end]
        raw.clear()
        if len(line) > limit:
            raise ProtocolError(f"a {what} over {limit} bytes")
        return line, end + 2

    def _feed_chunked(self, data: bytes, t_ns: int) -> bool:
        """Strip the chunk framing (sizes may be split anywhere across reads); True at the end of
        the trailer."""
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
                    break
                out.append(data[pos:end])
                pos, self.left, self.chunk_state = end, 0, "cr"
            elif state == "cr" and data.startswith(b"\r\n", pos):
                pos, self.chunk_state = pos + 2, "size"
            elif state in ("cr", "lf"):
                if data[pos] != (13 if state == "cr" else 10):
                    raise ProtocolError(f"a chunk did not end with CRLF: {data[pos : pos + 20]!r}")
                pos, self.chunk_state = pos + 1, "lf" if state == "cr" else "size"
            elif state == "size":
                # the usual case: the whole line is here
                match = None if self.raw else _CHUNK_HEAD.match(data, pos)
                if match is not None and match.end() - pos <= self.limits.chunk_line_bytes:
                    pos = match.end()
                else:
                    line, pos = self._line(
                        data, pos, self.limits.chunk_line_bytes, "chunk-size line"
                    )
                    if line is None:
                        break
                    match = _CHUNK_SIZE.fullmatch(line)
                    if match is None:
                        raise ProtocolError(
                            f"bad chunk size line {line[:40]!r} (expected 1 to 16 hex digits)"
                        )
                size = int(match[1], 16)
                if size > self.limits.body_bytes - self.body_bytes + n - pos:
                    raise ProtocolError(
                        f"a chunk of {size} bytes is over the body bound of "
                        f"{self.limits.body_bytes} bytes"
                    )
                end = pos + size
                # the whole chunk and its CRLF are here: the usual case
                if size and data.startswith(b"\r\n", end):
                    out.append(data[pos:end])
                    pos = end + 2
                else:
                    self.chunk_state, self.left = ("data", size) if size else ("trailer", 0)
            else:  # trailer lines, until an empty one ends the body
                line, after = self._line(data, pos, self.limits.header_bytes, "trailer line")
                self.trailer_bytes += after - pos
                if self.trailer_bytes > self.limits.header_bytes:
                    raise ProtocolError(f"a trailer over {self.limits.header_bytes} bytes")
                pos = after
                if line == b"":
                    complete = True
                    self.extra = self.extra or pos < n  # bytes after the response
                    break
        if out:
            self._body(out[0] if len(out) == 1 else b"".join(out), t_ns)
        return complete

    def _body(self, data: bytes, t_ns: int) -> None:
        """Body bytes: the event-stream lines to the Events (or, not 200, the start of the error
        text)."""
        if not data or self.finished:
            return
        if self.status != 200:
            self.error_body += data[: ERROR_BODY_BYTES - len(self.error_body)]
            return
        limit, tail = self.limits.line_bytes, self.tail
        if tail:
            # still no end of the line: append (linear), never re-copy the whole line
            if data.find(b"\n") < 0:
                if len(tail) + len(data) > limit:
                    raise ProtocolError(f"an event-stream line over {limit} bytes with no newline")
                tail += data
                return
            data = bytes(tail) + data
            tail.clear()
        lines = data.split(b"\n")
        last = lines.pop()
        if len(data) > limit and max(len(last), max(map(len, lines), default=0)) > limit:
            raise ProtocolError(f"an event-stream line over {limit} bytes")
        tail += last
        on_line = self.events.on_line
        for line in lines:
            # 13: a CR before the LF
            if line and on_line(line[:-1] if line[-1] == 13 else line, t_ns):
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
        if self.tail and self.events.on_line(bytes(self.tail.rstrip(b"\r")), t_ns):
            self.finished = True
            return
        self.events.on_end(t_ns)
        self.finished = True


class ProtocolError(Exception):
    """The server's bytes are not a well-formed, bounded HTTP/1.1 response."""
