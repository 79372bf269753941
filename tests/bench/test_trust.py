"""The bench trusts only the answer to the request it sent (issue 42, item 4): bytes waiting on a kept-alive socket
make it a new connection, a 200 answer that is not the protocol's (another media type, a content coding) is a failed
request with that reason, the endpoint check has one deadline and a size cap, and a request timeout is bounded."""

from __future__ import annotations

import gzip
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.bench.test_stream import (
    OPENAI_BODY,
    SSE_HEAD,
    TEXTS,
    Script,
    ScriptedServer,
    _answer,
    _chunked,
    _event,
    _openai,
    _run,
)
from trtkv.bench.transport.client import Endpoint, HttpSession, check_triton
from trtkv.bench.transport.openai import check_openai
from trtkv.bench.transport.stream import shared_loop
from trtkv.contracts.bench_doc import ERROR, OK
from trtkv.contracts.interface import LLMAPI
from trtkv.core.errors import RecipeError, TrtkvError
from trtkv.recipe import load_recipe


@pytest.fixture
def serve() -> Iterator[Callable[[Script], ScriptedServer]]:
    servers: list[ScriptedServer] = []

    def start(script: Script) -> ScriptedServer:
        servers.append(ScriptedServer(script))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


OTHER = _chunked(_event(" unsolicited") + b"\n\n", b"data: [DONE]\n\n")


def test_an_unsolicited_answer_never_becomes_the_next_requests(serve: Callable[[Script], ScriptedServer]) -> None:
    """Before: a second, unasked-for response on the kept-alive socket was the next request's successful answer
    (with its TTFT). Now bytes after an answer (in the same read, or arriving later) retire the connection."""
    def script(conn: socket.socket, n: int) -> bool:
        if n == 0:
            _answer(conn, SSE_HEAD + OPENAI_BODY + SSE_HEAD + OTHER)  # the extra answer in the same write
            return True
        _answer(conn, SSE_HEAD + OPENAI_BODY)
        return True

    server = serve(script)
    session = _openai(server)
    try:
        for _ in range(2):
            rec = _run(session)
            assert rec.status == OK and rec.text == "".join(TEXTS), (rec.status, rec.text, rec.error)
    finally:
        session.close()
    assert server.connections == 2

    # the extra answer arrives after the client read the first and before it sends the next request, by construction
    # (fixed sleeps of 0.2 s and 0.5 s raced on a busy CPU: issue 58)
    first_read, extra_sent = threading.Event(), threading.Event()

    def late(conn: socket.socket, n: int) -> bool:
        _answer(conn, SSE_HEAD + OPENAI_BODY)
        if n == 0:
            assert first_read.wait(10)
            _answer(conn, SSE_HEAD + OTHER)
            extra_sent.set()
        return True

    server = serve(late)
    session = _openai(server)
    try:
        assert _run(session).text == "".join(TEXTS)
        first_read.set()
        assert extra_sent.wait(10)
        assert _landed(session), "the extra answer never reached the kept-alive connection"
        rec = _run(session)
        assert rec.status == OK and rec.text == "".join(TEXTS), (rec.text, rec.error)
    finally:
        session.close()
    assert server.connections == 2


def _landed(session: Any, timeout_s: float = 10.0) -> bool:
    """The extra answer has reached the client: its bytes wait on the kept-alive socket, or the stream loop, which
    watches idle connections, has already retired that socket for them (either order can win on a busy CPU)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        sock = session._conn.sock
        try:
            if sock is None or sock.fileno() < 0 or select.select([sock], [], [], 0.05)[0]:
                return True
        except (ValueError, OSError):  # closed by the loop between the two looks
            return True
    return False


HTML = b"<html><body>proxy login</body></html>"
EVENTS = b"".join(b'data: {"text_output": "%s"}\n\n' % t.encode() for t in TEXTS)
GZIPPED = gzip.compress(EVENTS)


@pytest.mark.parametrize(("answer", "words"), [
    (b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n%s" % (len(HTML), HTML),
     "Content-Type 'text/html', not text/event-stream"),
    (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%s"
     % (len(GZIPPED), GZIPPED), "Content-Encoding 'gzip'"),
], ids=["html", "gzip"])
@pytest.mark.parametrize("protocol", ["http", "openai"])
def test_an_answer_that_is_not_the_protocols_fails_with_that_reason(
        serve: Callable[[Script], ScriptedServer], answer: bytes, words: str, protocol: str) -> None:
    """Before: --protocol http booked these as successes with 0 tokens; OpenAI said "ended without [DONE]"."""
    server = serve(lambda c, n: (_answer(c, answer), False)[1])
    if protocol == "http":
        session = HttpSession(Endpoint(f"127.0.0.1:{server.port}", "http", "tensorrt_llm",
                                       inputs={"text_input": "BYTES"}, interface=LLMAPI))
    else:
        session = _openai(server)
    try:
        rec = _run(session, timeout_s=5.0)
    finally:
        session.close()
    assert rec.status == ERROR and words in rec.error, rec.error


class _Drip:
    """A server that answers the check one byte every `pause_s` (or with a huge body)."""

    def __init__(self, answer: bytes, pause_s: float) -> None:
        self.answer, self.pause_s = answer, pause_s
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.sent = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            try:
                if self.pause_s:
                    for byte in self.answer:
                        conn.sendall(bytes([byte]))
                        time.sleep(self.pause_s)
                else:
                    conn.sendall(self.answer[:4096])
                    while True:  # an endless body
                        conn.sendall(b"x" * 65536)
                        self.sent += 65536
            except OSError:
                return


MODELS = b'{"data": [{"id": "m"}]}'


@pytest.mark.parametrize("protocol", ["openai", "http"])
def test_the_endpoint_check_has_one_deadline_and_a_size_cap(protocol: str) -> None:
    """Before: a server dripping a byte every 2 s held the check > 40 s, and a 300 MB /v1/models was read whole."""
    check = check_openai if protocol == "openai" else check_triton
    drip = _Drip(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                 % (len(MODELS), MODELS), pause_s=0.3)
    start = time.monotonic()
    with pytest.raises(TrtkvError, match="within 2 s"):
        check(Endpoint(f"127.0.0.1:{drip.port}", protocol, "m"), 2.0)
    assert time.monotonic() - start < 3.5
    drip.sock.close()
    for head in (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 300000000\r\n\r\n",
                 b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n"):
        huge = _Drip(head, pause_s=0.0)
        start = time.monotonic()
        with pytest.raises(TrtkvError, match=r"over (the body bound of )?4194304 bytes"):
            check(Endpoint(f"127.0.0.1:{huge.port}", protocol, "m"), 30.0)
        assert time.monotonic() - start < 10 and huge.sent < 64 << 20
        huge.sock.close()


def test_a_request_timeout_is_bounded_and_a_huge_one_does_not_stop_the_loop(
        serve: Callable[[Script], ScriptedServer]) -> None:
    """Before: bench.request_timeout_s=1e12 passed the schema and crashed the shared loop (select's limit)."""
    with pytest.raises(RecipeError, match=r"bench\.request_timeout_s"):
        load_recipe("smollm2_fp8kv", ["bench.request_timeout_s=1e12"])
    server = serve(lambda c, n: (_answer(c, SSE_HEAD + OPENAI_BODY), True)[1])
    session = _openai(server)
    loop = shared_loop()
    try:
        rec = _run(session, timeout_s=1e12)
        assert rec.status == OK, rec.error
        assert loop.alive and shared_loop() is loop
    finally:
        session.close()


def test_an_unsolicited_answer_fails_the_idle_connection_when_it_arrives(
        serve: Callable[[Script], ScriptedServer]) -> None:
    """Before: the answer nobody asked for stayed unread on the kept-alive socket until the next request (a peek then
    retired it, or, sent a moment later, the next request read it as its own). Now the loop watches an idle kept-alive
    socket: the connection is closed as the bytes arrive (the server sees it end) and counted."""
    closed = threading.Event()

    def late(conn: socket.socket, n: int) -> bool:
        _answer(conn, SSE_HEAD + OPENAI_BODY)
        if n == 0:
            time.sleep(0.2)
            _answer(conn, SSE_HEAD + OTHER)
            conn.settimeout(5.0)
            try:
                if conn.recv(65536) == b"":  # the client hung up without sending another request
                    closed.set()
            except OSError:
                closed.set()
            return False
        return True

    server = serve(late)
    session = _openai(server)
    before = shared_loop().unsolicited
    try:
        assert _run(session).text == "".join(TEXTS)
        assert closed.wait(3.0), "the idle connection was not closed when the unsolicited answer came"
        assert shared_loop().unsolicited == before + 1
        rec = _run(session)  # a new connection carries the next request
        assert rec.status == OK and rec.text == "".join(TEXTS), (rec.text, rec.error)
    finally:
        session.close()
    assert server.connections == 2
