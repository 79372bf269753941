"""A deterministic OpenAI-compatible completions server for client measurements (dev-only: tests/support/, used by
the tests and the benchmarks).

It answers GET /v1/models and POST /v1/completions: streamed, one vLLM 0.32-shaped SSE chunk per token (" the"), the
first `first_ms` after the request, the next ones `gap_ms` apart, `max_tokens` of them, the usage chunk when
`stream_options.include_usage` asks for it, then `data: [DONE]`. With no model behind it, every client's TTFT and
ITL should read first_ms and gap_ms; two clients that disagree here disagree on measurement, not on the server.

It is one thread with a selector and a timetable (a heap of due sends), in a process of its own (as a real server
is), so that at hundreds of streams its own lateness stays far below the gaps it replays: the thread per connection
that slept per token before it cost 48-86 us of CPU per event at 256 streams on this project's 2 cores, this loop
16-20 us. `GET /v1/replay/stats` says, since its last call, how many connections it accepted (that call's own
included) and how late its token sends, and its first tokens, were against the timetable (p50/p99/max), so a
measurement can tell the server's lateness from the client's. The timetable starts when the kernel received the request
(Linux receive stamps), so a late pickup by this process counts as its own lateness too.

As vLLM's server (uvicorn) it sets TCP_NODELAY, so a first token never waits for the ACK of the headers (Nagle), and
holds 2048 pending connections (Python's socketserver holds 5), so a burst of new connections is not dropped and
retried a second later by the kernel. Sources: uvicorn 0.55.0 `config.py` (`backlog: int = 2048`); CPython 3.11
`Lib/asyncio/selector_events.py` (`_SelectorSocketTransport.__init__` calls `base_events._set_nodelay`).

    .venv/bin/python tests/support/openai_replay.py --first-ms 300 --gap-ms 50     # prints the port, serves until killed
"""

from __future__ import annotations

import argparse
import heapq
import json
import multiprocessing
import selectors
import socket
import struct
import sys
import time
from typing import Any

MODEL = "replay"
SO_TIMESTAMPNS = 35 if sys.platform == "linux" else 0  # the kernel's receive stamps (as trtkv/bench/transport/stream.py)
STAMP_BYTES = socket.CMSG_SPACE(16) if SO_TIMESTAMPNS else 0
BACKLOG = 2048  # uvicorn's default --backlog, which vLLM's API server keeps
HEAD_BYTES = 65536
BODY_BYTES = 1 << 20


def chunk(text: str | None, finish: str | None = None, usage: dict[str, int] | None = None) -> bytes:
    choices = [] if text is None else [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
                                        "stop_reason": None, "token_ids": None, "prompt_logprobs": None,
                                        "prompt_token_ids": None}]
    event = {"id": "cmpl-replay", "object": "text_completion", "created": 0, "model": MODEL, "choices": choices,
             "usage": usage}
    return b"data: " + json.dumps(event).encode() + b"\n\n"


def _framed(part: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(part), part)


TOKEN = _framed(chunk(" the"))
LAST = _framed(chunk(" the", "length"))
DONE = _framed(b"data: [DONE]\n\n") + b"0\r\n\r\n"
STREAM_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


class _Conn:
    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.inbuf, self.outbuf = sock, bytearray(), bytearray()
        self.streaming, self.closed = False, False
        self.arrived = time.monotonic()  # when the last bytes read arrived (the kernel's stamp, on Linux)


class ReplayServer:
    """The selector loop: requests parsed as they arrive, streamed sends kept in a heap by due time."""

    def __init__(self, first_s: float, gap_s: float, default_tokens: int = 16, api_key: str | None = None) -> None:
        self.first_s, self.gap_s, self.default_tokens, self.api_key = first_s, gap_s, default_tokens, api_key
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=BACKLOG)
        self.listener.setblocking(False)
        self.port = int(self.listener.getsockname()[1])
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.listener, selectors.EVENT_READ, None)
        self.due: list[tuple[float, int, _Conn, bytes, str]] = []  # (when, seq, conn, bytes, kind)
        self.seq = 0
        self.late_ns: list[int] = []  # every token's send against the timetable
        self.first_late_ns: list[int] = []  # the first tokens' (the server's part of a TTFT tail)
        self.accepted = 0

    def serve_forever(self) -> None:
        while True:
            wait = None if not self.due else max(0.0, self.due[0][0] - time.monotonic())
            for key, mask in self.sel.select(wait):
                if key.data is None:
                    self._accept()
                elif mask & selectors.EVENT_WRITE:
                    self._flush(key.data)
                else:
                    self._read(key.data)
            self._send_due()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if SO_TIMESTAMPNS:
                sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            self.accepted += 1
            conn = _Conn(sock)
            self.sel.register(sock, selectors.EVENT_READ, conn)

    def _close(self, conn: _Conn) -> None:
        if not conn.closed:
            conn.closed = True
            self.sel.unregister(conn.sock)
            conn.sock.close()

    def _read(self, conn: _Conn) -> None:
        try:
            data, ancillary, _flags, _addr = conn.sock.recvmsg(65536, STAMP_BYTES)
            conn.arrived = time.monotonic()
            if ancillary and len(ancillary[0][2]) == 16:  # when the kernel had the bytes: its lateness is ours too
                sec, nsec = struct.unpack("@qq", ancillary[0][2])
                conn.arrived -= max(0.0, time.time() - (sec + nsec / 1e9))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(conn)
            return
        conn.inbuf += data
        self._next_request(conn)

    def _next_request(self, conn: _Conn) -> None:
        """Answer the request at the head of the buffer once it is complete (one at a time per connection)."""
        while not conn.streaming and not conn.closed:
            end = conn.inbuf.find(b"\r\n\r\n")
            if end < 0:
                if len(conn.inbuf) > HEAD_BYTES:
                    self._close(conn)
                return
            lines = bytes(conn.inbuf[:end]).decode("latin-1").split("\r\n")
            headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])}
            length = int(headers.get("content-length") or 0)
            if length > BODY_BYTES:
                self._close(conn)
                return
            if len(conn.inbuf) < end + 4 + length:
                return
            body = bytes(conn.inbuf[end + 4:end + 4 + length])
            del conn.inbuf[:end + 4 + length]
            method, path = (lines[0].split(" ") + ["", ""])[:2]
            self._handle(conn, method, path, headers, body)

    def _handle(self, conn: _Conn, method: str, path: str, headers: dict[str, str], body: bytes) -> None:
        arrived = conn.arrived
        if self.api_key is not None and path.startswith("/v1") \
                and headers.get("authorization") != f"Bearer {self.api_key}":
            self._json(conn, 401, {"error": {"message": "Unauthorized"}})
        elif method == "GET" and path.rstrip("/") == "/v1/models":
            self._json(conn, 200, {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "replay"}]})
        elif method == "GET" and path in ("/health", "/v1/health"):
            self._json(conn, 200, {})
        elif method == "GET" and path == "/v1/replay/stats":
            self._json(conn, 200, self._stats())
        elif method == "POST" and path == "/v1/completions":
            try:
                request = json.loads(body or b"{}")
            except ValueError:
                request = {}
            if not isinstance(request, dict) or not request.get("stream"):
                self._json(conn, 400, {"error": {"message": "this replay server streams /v1/completions only"}})
            else:
                self._stream(conn, request, arrived)
        else:
            self._json(conn, 404, {"error": {"message": f"no route {path}"}})

    def _json(self, conn: _Conn, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        reason = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found"}[status]
        self._write(conn, b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                    % (status, reason.encode(), len(data), data))

    def _stream(self, conn: _Conn, request: dict[str, Any], arrived: float) -> None:
        """The headers now; token i at arrived + first + i * gap; the usage chunk and [DONE] right after the last."""
        tokens = max(1, int(request.get("max_tokens") or self.default_tokens))
        conn.streaming = True
        self._write(conn, STREAM_HEAD)
        for i in range(tokens):
            kind = "first" if i == 0 else "token"
            self._schedule(arrived + self.first_s + i * self.gap_s, conn, LAST if i == tokens - 1 else TOKEN, kind)
        end = arrived + self.first_s + (tokens - 1) * self.gap_s
        if (request.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": 0, "completion_tokens": tokens, "total_tokens": tokens}
            self._schedule(end, conn, _framed(chunk(None, usage=usage)), "usage")
        self._schedule(end, conn, DONE, "end")

    def _schedule(self, when: float, conn: _Conn, data: bytes, kind: str) -> None:
        self.seq += 1
        heapq.heappush(self.due, (when, self.seq, conn, data, kind))

    def _send_due(self) -> None:
        now = time.monotonic()
        while self.due and self.due[0][0] <= now:
            when, _, conn, data, kind = heapq.heappop(self.due)
            if conn.closed:
                continue
            self._write(conn, data)
            if kind in ("first", "token"):
                late = int((time.monotonic() - when) * 1e9)
                self.late_ns.append(late)
                if kind == "first":
                    self.first_late_ns.append(late)
            if kind == "end":
                conn.streaming = False
                self._next_request(conn)
            now = time.monotonic()

    def _write(self, conn: _Conn, data: bytes) -> None:
        if conn.closed:
            return
        if conn.outbuf:  # earlier bytes still wait for the socket: keep the order
            conn.outbuf += data
            return
        try:
            sent = conn.sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._close(conn)
            return
        if sent < len(data):
            conn.outbuf += data[sent:]
            self.sel.modify(conn.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)

    def _flush(self, conn: _Conn) -> None:
        try:
            sent = conn.sock.send(conn.outbuf)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn)
            return
        del conn.outbuf[:sent]
        if not conn.outbuf:
            self.sel.modify(conn.sock, selectors.EVENT_READ, conn)

    def _stats(self) -> dict[str, Any]:
        """Since the last call (then reset): connections accepted, and how late the token sends (all, and the first
        of each request) were against the timetable."""
        late, first, self.late_ns, self.first_late_ns = self.late_ns, self.first_late_ns, [], []
        accepted, self.accepted = self.accepted, 0
        return {"connections": accepted, "events": len(late), "late_ms": _quantiles(late),
                "first_late_ms": _quantiles(first)}


def _quantiles(values_ns: list[int]) -> dict[str, float | None]:
    data = sorted(values_ns)
    if not data:
        return {"p50": None, "p99": None, "max": None}
    return {"p50": data[len(data) // 2] / 1e6, "p99": data[min(len(data) - 1, int(0.99 * len(data)))] / 1e6,
            "max": data[-1] / 1e6}


def stats(port: int) -> dict[str, Any]:
    """GET /v1/replay/stats of the replay server on 127.0.0.1:`port` (and reset them)."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/v1/replay/stats")
        return dict(json.loads(conn.getresponse().read()))
    finally:
        conn.close()


def serve(first_s: float, gap_s: float, port_out: Any, default_tokens: int = 16, api_key: str | None = None) -> None:
    """Serve on 127.0.0.1 (a free port, put on `port_out`) until the process is terminated. `api_key`: every /v1
    request must carry `Authorization: Bearer <key>` (401 otherwise), as vLLM's --api-key asks."""
    server = ReplayServer(first_s, gap_s, default_tokens, api_key)
    port_out.put(server.port)
    server.serve_forever()


def start(first_ms: float, gap_ms: float, default_tokens: int = 16,
          api_key: str | None = None) -> tuple[multiprocessing.Process, int]:
    """The server in a daemon process of its own; (process, port). Stop it with process.terminate()."""
    ports: Any = multiprocessing.Queue()
    proc = multiprocessing.Process(target=serve, args=(first_ms / 1e3, gap_ms / 1e3, ports, default_tokens, api_key),
                                   daemon=True)
    proc.start()
    return proc, int(ports.get(timeout=30))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--first-ms", type=float, default=300.0, help="time to the first token")
    ap.add_argument("--gap-ms", type=float, default=50.0, help="time between tokens")
    args = ap.parse_args()
    proc, port = start(args.first_ms, args.gap_ms)
    print(f"replay server on 127.0.0.1:{port} (model {MODEL!r}); Ctrl-C stops it", flush=True)
    try:
        proc.join()
    except KeyboardInterrupt:
        proc.terminate()


if __name__ == "__main__":
    main()
