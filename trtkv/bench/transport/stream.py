"""One client thread for every streaming HTTP request of the process: a selector loop over
non-blocking sockets (keep-alive, a stale socket retried once, deadlines, cancel); the HTTP/1.1
parsing is trtkv.bench.transport.http1's.

Why: with a blocking connection per worker thread, every streamed event wakes a thread and takes the
GIL from the others; at concurrency 8 that wake-up, not the parsing, was most of the client's CPU
per token. Here the worker threads of the load generator only hand a request over and wake once,
when it is done; the loop reads whatever is ready on all connections in one pass.

A server's bytes never stop the loop: the parser (http1) is bounded and raises ProtocolError on
anything malformed, which fails that request only, as does any other exception while serving one
request; the others keep going.

A request's send time is when the loop puts it on the wire (on a new connection: when the connect
starts, so TTFT includes the connect, as AIPerf's does), not when a worker thread asked: a worker
that waited for the GIL or for the loop is the client's delay, not the server's.

Each request's record gets the CPU the loop spent on it: a pass's CPU time (select included) is
split over the requests the pass served, and the worker adds its own (building the body, waking up).
"""

from __future__ import annotations

import errno
import os
import selectors
import socket
import struct
import sys
import threading
import time
from collections import deque

from trtkv.bench.transport.http1 import Call, Connection, Events, ProtocolError
from trtkv.contracts.bench_doc import CANCELLED, ERROR, OK, TIMEOUT, RequestRecord, now_ns

RECV_BYTES = 65536
NO_DEADLINE = float("inf")
# after the last event, how long to wait for the end of the body before closing instead
DRAIN_S = 2.0
# Linux stamps every received packet when a socket asks (SO_TIMESTAMPNS, 35 in
# include/uapi/asm-generic/socket.h; Python's socket module does not name it): the time from that
# stamp to the loop's pass that read it is the client's own lag, how long bytes already here waited
# for the loop (the stamp is the read's last packet: a lower bound)
SO_TIMESTAMPNS = 35 if sys.platform == "linux" else 0
STAMP = struct.Struct("@qq")  # struct timespec on 64-bit Linux
STAMP_BYTES = socket.CMSG_SPACE(STAMP.size) if SO_TIMESTAMPNS else 0
# one read in 8 fetches the stamp: recvmsg with it cost 2-4 us more per event than recv
# (client_cost)
LAG_SAMPLE = 8
# one select() at most (poll's own limit is 24.8 days: a huge timeout must not crash the loop)
MAX_WAIT_S = 3600.0


class StreamLoop:
    """The selector loop (one daemon thread per process, started on first use)."""

    def __init__(self) -> None:
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._inbox: deque[tuple[str, Connection, Call | None]] = deque()
        self._calls: set[Call] = set()
        # the calls' earliest deadline (None: to be recomputed)
        self._earliest: float | None = NO_DEADLINE
        self._reads = 0
        # kept-alive connections that got bytes (or a close) with no request outstanding: each is
        # closed when they arrive, never read as the next request's answer
        self.unsolicited = 0
        self._thread = threading.Thread(target=self._run, daemon=True, name="trtkv-stream-loop")
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # -- called from worker threads
    # ----------------------------------------------------------------------------
    def start(
        self,
        conn: Connection,
        request: bytes,
        record: RequestRecord,
        events: Events,
        timeout_s: float,
    ) -> threading.Event:
        """Send `request` on `conn` and parse its streamed answer into `record`; the event is set
        when done."""
        done = threading.Event()
        call = Call(conn, request, record, events, timeout_s, done)
        conn.call = call
        self._post("start", conn, call)
        return done

    def close(self, conn: Connection) -> None:
        self._post("close", conn, None)

    def _post(self, what: str, conn: Connection, call: Call | None) -> None:
        self._inbox.append((what, conn, call))
        try:
            self._wake_w.send(b"\0")
        except (BlockingIOError, InterruptedError):
            pass  # the pipe is full: the loop is awake anyway

    # -- the loop thread
    # ---------------------------------------------------------------------------------------
    def _run(self) -> None:
        select, perf_counter_ns, monotonic, thread_time_ns = (
            self._sel.select,
            now_ns,
            time.monotonic,
            time.thread_time_ns,
        )
        time_ns = time.time_ns
        cpu_prev = thread_time_ns()
        unattributed = 0
        while True:
            if self._earliest is None:
                self._earliest = min((c.deadline for c in self._calls), default=NO_DEADLINE)
            # sleep until the next deadline or until something arrives (no periodic wake-ups: each
            # one would be CPU charged to the requests in flight)
            wait = (
                None
                if self._earliest == NO_DEADLINE
                else min(MAX_WAIT_S, max(0.0, self._earliest - monotonic()))
            )
            ready = select(wait)
            t_ns, wall_ns = perf_counter_ns(), time_ns()
            served: set[Call] = set()
            ended: list[Call] = []
            for key, mask in ready:
                call = key.data
                if call is None:
                    self._drain_inbox(served, ended)
                    continue
                if isinstance(call, Connection):  # an idle kept-alive socket spoke: retire it
                    self._retire(call)
                    continue
                served.add(call)
                try:
                    if mask & selectors.EVENT_READ:
                        self._read(call, t_ns, wall_ns, ended)
                    else:
                        self._write(call, ended)
                except Exception as exc:  # noqa: BLE001 - one request's surprise fails it, never the loop all share
                    self._finish(
                        call,
                        ERROR,
                        f"client error: {type(exc).__name__}: {_describe(exc)}",
                        t_ns,
                        ended,
                    )
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
            # after the CPU is booked: the worker reads the record as soon as it wakes
            for call in ended:
                call.done.set()

    def _drain_inbox(self, served: set[Call], ended: list[Call]) -> None:
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

    def _retire(self, conn: Connection) -> None:
        """Bytes (or a close) on a kept-alive socket with no request outstanding: an unsolicited
        answer fails the connection now; it is never read as the next request's."""
        self._unregister(conn)
        if conn.sock is None:
            return
        try:
            data = conn.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):  # woken for nothing: watch on
            self._sel.register(conn.sock, selectors.EVENT_READ, conn)
            return
        except OSError:
            data = b""
        self.unsolicited += bool(data)  # b"": the server closed an idle connection (its right)
        conn.close()

    def _begin(self, call: Call, ended: list[Call]) -> None:
        conn = call.conn
        self._unregister(conn)  # idle: watched for unsolicited bytes until now
        # bytes nobody asked for, or closed: never reuse it
        if conn.sock is not None and not _idle(conn.sock):
            conn.close()
        # the request goes on the wire now (a new connection: its connect starts now)
        call.record.send_ns = now_ns()
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
            self._sel.register(
                conn.sock, selectors.EVENT_READ if done else selectors.EVENT_WRITE, call
            )
            return
        try:
            sock = socket.socket(
                socket.AF_INET6 if ":" in conn.host else socket.AF_INET, socket.SOCK_STREAM
            )
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if SO_TIMESTAMPNS:
                sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            err = sock.connect_ex((conn.host, conn.port))
        except OSError as exc:
            self._finish(call, ERROR, _describe(exc), now_ns(), ended)
            return
        conn.sock, conn.requests = sock, 0
        if err not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK):
            self._finish(call, ERROR, _describe(OSError(err, os.strerror(err))), now_ns(), ended)
            return
        self._sel.register(sock, selectors.EVENT_WRITE, call)

    def _write(self, call: Call, ended: list[Call]) -> None:
        """Writable: a connect finished (or failed), or more of the request can be sent."""
        conn, sock = call.conn, call.conn.sock
        if sock is None:
            return
        try:
            if call.sent == 0 and conn.requests == 0:
                err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    raise OSError(err, os.strerror(err))
            call.sent += sock.send(call.request[call.sent :])
            if call.sent >= len(call.request):
                self._sel.modify(sock, selectors.EVENT_READ, call)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            if not self._retry_stale(call, ended):
                self._finish(call, ERROR, _describe(exc), now_ns(), ended)

    def _read(self, call: Call, t_ns: int, wall_ns: int, ended: list[Call]) -> None:
        """Readable: the next part of the answer (the hot path: one event per call at a decoding
        server's pace)."""
        sock = call.conn.sock
        if sock is None:
            return
        try:
            self._reads += 1
            if STAMP_BYTES and self._reads % LAG_SAMPLE == 0:
                data, ancillary, _flags, _addr = sock.recvmsg(RECV_BYTES, STAMP_BYTES)
                if ancillary and len(ancillary[0][2]) == STAMP.size:
                    sec, nsec = STAMP.unpack(ancillary[0][2])
                    call.record.client_lag_us.append(
                        max(0, wall_ns - sec * 1_000_000_000 - nsec) // 1000
                    )
            else:
                data = sock.recv(RECV_BYTES)
            if not data:
                self._closed_by_server(call, t_ns, ended)
            elif call.feed(data, t_ns):
                call.end_of_body(t_ns)
                call.conn.requests += 1
                self._finish(call, None, "", t_ns, ended, keep=call.keep_alive and not call.extra)
            elif call.finished:
                # an error event: this connection's answer is not worth reading
                if call.record.status != OK:
                    self._finish(call, None, "", t_ns, ended)
                else:  # done (OpenAI's [DONE]): the end of the body normally follows at once
                    call.deadline = min(call.deadline, time.monotonic() + DRAIN_S)
                    if self._earliest is not None:
                        self._earliest = min(self._earliest, call.deadline)
        except (BlockingIOError, InterruptedError):
            return
        except ProtocolError as exc:
            self._finish(call, ERROR, f"bad HTTP response: {exc}", t_ns, ended)
        except OSError as exc:
            if not self._retry_stale(call, ended):
                self._finish(call, ERROR, _describe(exc), t_ns, ended)

    def _closed_by_server(self, call: Call, t_ns: int, ended: list[Call]) -> None:
        if self._retry_stale(call, ended):
            return
        if call.status and call.body_mode == "close":
            call.end_of_body(t_ns)
            self._finish(call, None, "", t_ns, ended)
            return
        what = "mid-response" if call.received else "before answering"
        self._finish(call, ERROR, f"Remote end closed connection {what}", t_ns, ended)

    def _retry_stale(self, call: Call, ended: list[Call]) -> bool:
        """A reused keep-alive socket the server had closed while idle fails before any byte of the
        answer: send once more on a fresh connection (what every HTTP client library does)."""
        conn = call.conn
        if call.received or call.retried or conn.requests == 0:
            return False
        call.retried, call.sent = True, 0
        self._unregister(conn)
        conn.close()
        self._begin(call, ended)
        return True

    def _expire(self, served: set[Call], ended: list[Call]) -> None:
        now = time.monotonic()
        self._earliest = None  # recomputed over the calls left
        for call in [c for c in self._calls if c.deadline <= now]:
            served.add(call)
            if call.received:
                error = f"not finished within {call.timeout_s:g} s"
            else:
                error = f"no response within {call.timeout_s:g} s"
            self._finish(call, TIMEOUT, error, now_ns(), ended)

    def _finish(
        self,
        call: Call,
        status: str | None,
        error: str,
        t_ns: int,
        ended: list[Call],
        keep: bool = False,
    ) -> None:
        """The request is over: book its status (unless it has one), release or close the socket,
        wake its worker at the end of the pass."""
        if status is not None:
            call.fail(status, error, t_ns)
        if not call.finished:
            call.fail(ERROR, "the response ended early", t_ns)
        conn = call.conn
        self._unregister(conn)
        if not (keep and call.record.status == OK):
            conn.close()
        elif conn.sock is not None:  # kept alive: watched while idle (see _retire)
            self._sel.register(conn.sock, selectors.EVENT_READ, conn)
        if call in self._calls:
            self._calls.discard(call)
            ended.append(call)

    def _unregister(self, conn: Connection) -> None:
        if conn.sock is not None:
            try:
                self._sel.unregister(conn.sock)
            except (KeyError, ValueError):
                pass


def _idle(sock: socket.socket) -> bool:
    """True when a kept-alive socket holds no unread byte and is still open (a peek, nothing
    consumed): an answer that arrives before the request is sent (an unsolicited or late response)
    must never become that request's."""
    try:
        sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except (BlockingIOError, InterruptedError):
        return True
    except OSError:
        return False
    return False  # a byte is waiting, or the server closed the connection


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


def stream(
    conn: Connection, request: bytes, record: RequestRecord, events: Events, timeout_s: float
) -> None:
    """Run one request on the shared loop and return when its record is final. The calling thread
    sleeps until then (it is not woken per event); Ctrl-C in it cancels the request."""
    loop = shared_loop()
    done = loop.start(conn, request, record, events, timeout_s)
    grace = time.monotonic() + timeout_s + 5.0
    try:
        while not done.wait(5.0):  # long slices: each wake-up is CPU charged to the request
            if time.monotonic() > grace or not loop.alive:
                record.status, record.error, record.end_ns = (
                    ERROR,
                    "the client's stream loop stopped",
                    now_ns(),
                )
                return
    except KeyboardInterrupt:
        loop.close(conn)
        done.wait(2.0)
        raise
