"""One client thread for every streaming HTTP request of the process: a selector loop over non-blocking sockets that
speaks just enough HTTP/1.1 (keep-alive, chunked / Content-Length / until-close bodies) to read server-sent events.

Why: with a blocking connection per worker thread, every streamed event wakes a thread and takes the GIL from the
others; at concurrency 8 that wake-up, not the parsing, was most of the client's CPU per token. Here the worker
threads of the load generator only hand a request over and wake once, when it is done; the loop reads whatever
is ready on all connections in one pass.

Each request's record gets the CPU the loop spent on it: a pass's CPU time (select included) is split over the
requests the pass served, and the worker adds its own (building the body, waking up).
"""

from __future__ import annotations

import errno
import os
import selectors
import socket
import threading
import time
from collections import deque
from typing import Protocol

from trtkv.bench.records import CANCELLED, ERROR, OK, TIMEOUT, RequestRecord

RECV_BYTES = 65536
ERROR_BODY_BYTES = 4096  # enough of a non-200 answer to quote it
MAX_HEADER_BYTES = 65536
NO_DEADLINE = float("inf")
DRAIN_S = 2.0  # after the last event, how long to wait for the end of the body before closing instead


def now_ns() -> int:
    return time.perf_counter_ns()


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
        self.call: _Call | None = None

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
            self.sock = None


class _Call:
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
                    raise _ProtocolError(f"no end of the response headers within {MAX_HEADER_BYTES} bytes")
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
            raise _ProtocolError(f"not an HTTP response: {lines[0][:80]!r}")
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
                    raise _ProtocolError(f"bad chunk size line {line[:40]!r}") from None
                self.chunk_state, self.left = ("data", size) if size else ("trailer", 0)
            elif state == "crlf":
                if line:
                    raise _ProtocolError("a chunk did not end with CRLF")
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


class _ProtocolError(Exception):
    pass


class StreamLoop:
    """The selector loop (one daemon thread per process, started on first use)."""

    def __init__(self) -> None:
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._inbox: deque[tuple[str, Connection, _Call | None]] = deque()
        self._calls: set[_Call] = set()
        self._earliest: float | None = NO_DEADLINE  # the calls' earliest deadline (None: to be recomputed)
        self._thread = threading.Thread(target=self._run, daemon=True, name="trtkv-stream-loop")
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # -- called from worker threads ----------------------------------------------------------------------------
    def start(self, conn: Connection, request: bytes, record: RequestRecord, events: Events,
              timeout_s: float) -> threading.Event:
        """Send `request` on `conn` and parse its streamed answer into `record`; the event is set when done."""
        done = threading.Event()
        call = _Call(conn, request, record, events, timeout_s, done)
        conn.call = call
        self._post("start", conn, call)
        return done

    def close(self, conn: Connection) -> None:
        self._post("close", conn, None)

    def _post(self, what: str, conn: Connection, call: _Call | None) -> None:
        self._inbox.append((what, conn, call))
        try:
            self._wake_w.send(b"\0")
        except (BlockingIOError, InterruptedError):
            pass  # the pipe is full: the loop is awake anyway

    # -- the loop thread ---------------------------------------------------------------------------------------
    def _run(self) -> None:
        select, perf_counter_ns, monotonic, thread_time_ns = self._sel.select, now_ns, time.monotonic, time.thread_time_ns
        cpu_prev = thread_time_ns()
        unattributed = 0
        while True:
            if self._earliest is None:
                self._earliest = min((c.deadline for c in self._calls), default=NO_DEADLINE)
            # sleep until the next deadline or until something arrives (no periodic wake-ups: each one would be
            # CPU charged to the requests in flight)
            ready = select(None if self._earliest == NO_DEADLINE else max(0.0, self._earliest - monotonic()))
            t_ns = perf_counter_ns()
            served: set[_Call] = set()
            ended: list[_Call] = []
            for key, mask in ready:
                call = key.data
                if call is None:
                    self._drain_inbox(served, ended)
                    continue
                served.add(call)
                if mask & selectors.EVENT_READ:
                    self._read(call, t_ns, ended)
                else:
                    self._write(call, ended)
            if monotonic() >= self._earliest:
                self._expire(served, ended)
            cpu = thread_time_ns()
            unattributed += cpu - cpu_prev
            cpu_prev = cpu
            if served:
                share = unattributed // len(served)
                for call in served:
                    call.record.client_cpu_ns += share
                unattributed = 0
            for call in ended:  # after the CPU is booked: the worker reads the record as soon as it wakes
                call.done.set()

    def _drain_inbox(self, served: set[_Call], ended: list[_Call]) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        while self._inbox:
            what, conn, call = self._inbox.popleft()
            if what == "close":  # a request still in flight (Ctrl-C) is cancelled with it
                if conn.call is not None and conn.call in self._calls:
                    served.add(conn.call)
                    self._finish(conn.call, CANCELLED, "interrupted (Ctrl-C)", now_ns(), ended)
                self._unregister(conn)
                conn.close()
                continue
            if call is None:
                continue
            served.add(call)
            self._calls.add(call)
            if self._earliest is not None:
                self._earliest = min(self._earliest, call.deadline)
            self._begin(call, ended)

    def _begin(self, call: _Call, ended: list[_Call]) -> None:
        conn = call.conn
        if conn.sock is not None:  # a kept-alive socket: send at once
            try:
                call.sent = conn.sock.send(call.request)
            except (BlockingIOError, InterruptedError):
                call.sent = 0
            except OSError as exc:
                if not self._retry_stale(call, ended):
                    self._finish(call, ERROR, _describe(exc), now_ns(), ended)
                return
            done = call.sent >= len(call.request)
            self._sel.register(conn.sock, selectors.EVENT_READ if done else selectors.EVENT_WRITE, call)
            return
        try:
            sock = socket.socket(socket.AF_INET6 if ":" in conn.host else socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            err = sock.connect_ex((conn.host, conn.port))
        except OSError as exc:
            self._finish(call, ERROR, _describe(exc), now_ns(), ended)
            return
        conn.sock, conn.requests = sock, 0
        if err not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK):
            self._finish(call, ERROR, _describe(OSError(err, os.strerror(err))), now_ns(), ended)
            return
        self._sel.register(sock, selectors.EVENT_WRITE, call)

    def _write(self, call: _Call, ended: list[_Call]) -> None:
        """Writable: a connect finished (or failed), or more of the request can be sent."""
        conn, sock = call.conn, call.conn.sock
        if sock is None:
            return
        try:
            if call.sent == 0 and conn.requests == 0:
                err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    raise OSError(err, os.strerror(err))
            call.sent += sock.send(call.request[call.sent:])
            if call.sent >= len(call.request):
                self._sel.modify(sock, selectors.EVENT_READ, call)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            if not self._retry_stale(call, ended):
                self._finish(call, ERROR, _describe(exc), now_ns(), ended)

    def _read(self, call: _Call, t_ns: int, ended: list[_Call]) -> None:
        """Readable: the next part of the answer (the hot path: one event per call at a decoding server's pace)."""
        sock = call.conn.sock
        if sock is None:
            return
        try:
            data = sock.recv(RECV_BYTES)
            if not data:
                self._closed_by_server(call, t_ns, ended)
            elif call.feed(data, t_ns):
                call.end_of_body(t_ns)
                call.conn.requests += 1
                self._finish(call, None, "", t_ns, ended, keep=call.keep_alive)
            elif call.finished:
                if call.record.status != OK:  # an error event: this connection's answer is not worth reading
                    self._finish(call, None, "", t_ns, ended)
                else:  # done (OpenAI's [DONE]): the end of the body normally follows at once
                    call.deadline = min(call.deadline, time.monotonic() + DRAIN_S)
                    if self._earliest is not None:
                        self._earliest = min(self._earliest, call.deadline)
        except (BlockingIOError, InterruptedError):
            return
        except _ProtocolError as exc:
            self._finish(call, ERROR, f"bad HTTP response: {exc}", t_ns, ended)
        except OSError as exc:
            if not self._retry_stale(call, ended):
                self._finish(call, ERROR, _describe(exc), t_ns, ended)

    def _closed_by_server(self, call: _Call, t_ns: int, ended: list[_Call]) -> None:
        if self._retry_stale(call, ended):
            return
        if call.status and call.body_mode == "close":
            call.end_of_body(t_ns)
            self._finish(call, None, "", t_ns, ended)
            return
        what = "mid-response" if call.received else "before answering"
        self._finish(call, ERROR, f"Remote end closed connection {what}", t_ns, ended)

    def _retry_stale(self, call: _Call, ended: list[_Call]) -> bool:
        """A reused keep-alive socket the server had closed while idle fails before any byte of the answer: send
        once more on a fresh connection (what every HTTP client library does)."""
        conn = call.conn
        if call.received or call.retried or conn.requests == 0:
            return False
        call.retried, call.sent = True, 0
        self._unregister(conn)
        conn.close()
        self._begin(call, ended)
        return True

    def _expire(self, served: set[_Call], ended: list[_Call]) -> None:
        now = time.monotonic()
        self._earliest = None  # recomputed over the calls left
        for call in [c for c in self._calls if c.deadline <= now]:
            served.add(call)
            if call.received:
                error = f"not finished within {call.timeout_s:g} s"
            else:
                error = f"no response within {call.timeout_s:g} s"
            self._finish(call, TIMEOUT, error, now_ns(), ended)

    def _finish(self, call: _Call, status: str | None, error: str, t_ns: int, ended: list[_Call],
                keep: bool = False) -> None:
        """The request is over: book its status (unless it has one), release or close the socket, wake its
        worker at the end of the pass."""
        if status is not None:
            call.fail(status, error, t_ns)
        if not call.finished:
            call.fail(ERROR, "the response ended early", t_ns)
        conn = call.conn
        self._unregister(conn)
        if not (keep and call.record.status == OK):
            conn.close()
        if call in self._calls:
            self._calls.discard(call)
            ended.append(call)

    def _unregister(self, conn: Connection) -> None:
        if conn.sock is not None:
            try:
                self._sel.unregister(conn.sock)
            except (KeyError, ValueError):
                pass


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


_LOOP: StreamLoop | None = None
_LOOP_LOCK = threading.Lock()


def shared_loop() -> StreamLoop:
    """The process's loop, started on first use (and again if it ever died)."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None or not _LOOP.alive:
            _LOOP = StreamLoop()
        return _LOOP


def http_request(method: str, host: str, port: int, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    """The bytes of one HTTP/1.1 request with a body (keep-alive, no compression)."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}", "Accept-Encoding: identity",
             f"Content-Length: {len(body)}", *(f"{k}: {v}" for k, v in headers.items()), "", ""]
    return "\r\n".join(lines).encode("latin-1") + body


def stream(conn: Connection, request: bytes, record: RequestRecord, events: Events, timeout_s: float) -> None:
    """Run one request on the shared loop and return when its record is final. The calling thread sleeps until
    then (it is not woken per event); Ctrl-C in it cancels the request."""
    loop = shared_loop()
    done = loop.start(conn, request, record, events, timeout_s)
    grace = time.monotonic() + timeout_s + 5.0
    try:
        while not done.wait(5.0):  # long slices: each wake-up is CPU charged to the request
            if time.monotonic() > grace or not loop.alive:
                record.status, record.error, record.end_ns = ERROR, "the client's stream loop stopped", now_ns()
                return
    except KeyboardInterrupt:
        loop.close(conn)
        done.wait(2.0)
        raise
