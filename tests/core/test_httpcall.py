"""trtkv.core.httpcall, the one helper for trtkv's own small requests: one deadline, a byte bound, the API key, no
proxy, clear errors; and the same helper through the bench's strict parser (http1_fetch.strict)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from trtkv.bench.transport.http1 import ProtocolError
from trtkv.bench.transport.http1_fetch import strict
from trtkv.core.apikey import API_KEY_ENV, TRITON_KEY_HEADER
from trtkv.core.httpcall import HttpError, Target, request


class _Raw:
    """A one-answer-per-connection server sending `answer` (byte by byte every `pause_s` when set); keeps what it got."""

    def __init__(self, answer: bytes, pause_s: float = 0.0) -> None:
        self.answer, self.pause_s, self.got = answer, pause_s, b""
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                try:
                    self.got = _read_request(conn)
                    if self.pause_s:
                        for byte in self.answer:
                            conn.sendall(bytes([byte]))
                            time.sleep(self.pause_s)
                    else:
                        conn.sendall(self.answer)
                except OSError:
                    pass


def _read_request(conn: socket.socket) -> bytes:
    got = b""
    while b"\r\n\r\n" not in got or len(got.partition(b"\r\n\r\n")[2]) < _length(got):
        data = conn.recv(65536)
        if not data:
            break
        got += data
    return got


def _length(got: bytes) -> int:
    for line in got.partition(b"\r\n\r\n")[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 0


@pytest.fixture
def raw() -> Iterator[list[_Raw]]:
    made: list[_Raw] = []
    yield made
    for server in made:
        server.sock.close()


def _server(made: list[_Raw], answer: bytes, pause_s: float = 0.0) -> _Raw:
    server = _Raw(answer, pause_s)
    made.append(server)
    return server


OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\nConnection: close\r\n\r\n{\"a\": true}"


@pytest.mark.parametrize("bench", [False, True])
def test_a_request_sends_the_key_and_json_and_reads_the_answer(raw: list[_Raw], bench: bool,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(API_KEY_ENV, "k3y")
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")  # not used: trtkv's own requests go direct
    server = _server(raw, OK)
    answer = request(f"127.0.0.1:{server.port}/v1/x", {"n": 1}, timeout_s=5.0, transport=strict() if bench else None)
    assert (answer.status, answer.text) == (200, '{"a": true}')
    head = server.got.decode()
    assert head.startswith("POST /v1/x HTTP/1.1\r\n") and head.endswith('{"n": 1}')
    assert f"{TRITON_KEY_HEADER}: k3y" in head and "Authorization: Bearer k3y" in head
    assert "Content-Type: application/json" in head


@pytest.mark.parametrize("bench", [False, True])
def test_one_deadline_holds_against_a_dripping_server(raw: list[_Raw], bench: bool) -> None:
    server = _server(raw, OK, pause_s=0.2)
    start = time.monotonic()
    with pytest.raises((HttpError, TimeoutError), match="within 1 s"):
        request(f"http://127.0.0.1:{server.port}/", timeout_s=1.0, transport=strict() if bench else None)
    assert time.monotonic() - start < 2.5


@pytest.mark.parametrize("bench", [False, True])
def test_an_answer_over_the_bound_is_refused(raw: list[_Raw], bench: bool) -> None:
    server = _server(raw, OK)
    with pytest.raises((HttpError, ProtocolError), match="10 bytes"):
        request(f"127.0.0.1:{server.port}/", timeout_s=5.0, max_bytes=10, transport=strict() if bench else None)


def test_a_body_shorter_than_its_content_length_is_an_error(raw: list[_Raw]) -> None:
    server = _server(raw, OK.replace(b"Length: 11", b"Length: 40"))
    with pytest.raises(HttpError, match="before its Content-Length"):
        request(f"127.0.0.1:{server.port}/", timeout_s=5.0)


def test_a_closed_port_is_the_connections_own_error() -> None:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        port = sock.getsockname()[1]
    with pytest.raises(ConnectionRefusedError):
        request(f"127.0.0.1:{port}/", timeout_s=2.0)


def test_urls_are_split_loopback_first_and_bad_ones_named() -> None:
    assert Target.parse(":8000") == Target("127.0.0.1", 8000, "/")
    assert Target.parse("[::1]:8000/v1/models") == Target("::1", 8000, "/v1/models")
    assert Target.parse("http://host:9/v2/models/m#1/ready") == Target("host", 9, "/v2/models/m#1/ready")
    for bad, why in (("https://h:1/", "not http://"), ("h:70000/", "no valid port"), ("h:1/a b", "space")):
        with pytest.raises(HttpError, match=why):
            request(bad, timeout_s=1.0)


def test_the_vllm_runners_generate_names_a_refusal_and_reads_a_completion(raw: list[_Raw]) -> None:
    from trtkv.backends.vllm import VllmRunner
    from trtkv.core.errors import StageError
    from trtkv.recipe import load_recipe

    body = b'{"choices": [{"text": " world"}]}'
    good = _server(raw, b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    recipe = load_recipe("smollm2_fp8kv_vllm", [f"triton.http_port={good.port}"])
    assert VllmRunner().local_generate(recipe, "Hello", 1, None) == " world"
    assert b'"prompt": "Hello"' in good.got
    refused = _server(raw, b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 2\r\n\r\nno")
    recipe = load_recipe("smollm2_fp8kv_vllm", [f"triton.http_port={refused.port}"])
    with pytest.raises(StageError, match="answered HTTP 401 without a completion: 'no'"):
        VllmRunner().local_generate(recipe, "Hello", 1, None)
