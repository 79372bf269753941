"""The health checks decide with explicit exits, never `assert` (PYTHONOPTIMIZE strips it), read a bounded answer,
give the whole request one deadline (a server that drips bytes cannot stretch it), and send the API key of
$TRTKV_API_KEY when one is set: the container canary (a python3 program run by docker/Kubernetes) and trtkv.serving.health
(`trtkv status`, the supervisor), each against a loopback server that misbehaves on purpose."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from trtkv.contracts.canary import canary_script
from trtkv.core.apikey import API_KEY_ENV, TRITON_KEY_HEADER
from trtkv.serving import health

KEY = "sentinel-key-5d41402abc4b2a76"


class Server:
    """A raw loopback HTTP/1.1 server answering every request the way `mode` says, keeping each request's headers."""

    def __init__(self, mode: str) -> None:
        self.mode, self.headers = mode, []  # type: ignore[var-annotated]
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            head = data.split(b"\r\n\r\n")[0].decode().split("\r\n")[1:]
            self.headers.append({k.lower(): v.strip() for k, _, v in (h.partition(":") for h in head)})
            try:
                self._reply(conn)
            except OSError:
                pass

    def _reply(self, conn: socket.socket) -> None:
        ok = json.dumps({"text_output": " Hi", "choices": [{"text": " Hi"}]}).encode()
        if self.mode == "ok":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(ok) + ok)
        elif self.mode == "error":  # 200 with an error object and no text: the canary must fail, asserts or not
            body = b'{"error": "model instance is dead"}'
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        elif self.mode == "huge":  # a valid answer, but 8 MiB of it
            body = json.dumps({"text_output": "x" * (8 << 20), "choices": [{"text": "x"}]}).encode()
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        elif self.mode == "drip":  # one byte every 0.2 s for 8 s: never idle long enough for a per-socket timeout
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(ok))
            for i in range(40):
                if self.stop.is_set():
                    return
                conn.sendall(ok[i % len(ok):i % len(ok) + 1] if i < len(ok) - 1 else b" ")
                time.sleep(0.2)

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[Server]:
    s = Server(request.param)
    yield s
    s.close()


def run_canary(port: int, env: dict[str, str] | None = None, **kwargs: Any) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", canary_script(port, **kwargs)], capture_output=True, text=True,
                          timeout=60, env={**os.environ, **(env or {})})
    return proc, time.monotonic() - start


@pytest.mark.parametrize("server", ["ok"], indirect=True)
def test_canary_script_passes_on_an_answer(server: Server) -> None:
    proc, _ = run_canary(server.port)
    assert proc.returncode == 0, proc.stderr
    proc, _ = run_canary(server.port, openai_model="m")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("server", ["error"], indirect=True)
def test_canary_script_fails_on_no_text_even_under_pythonoptimize(server: Server) -> None:
    for env in ({}, {"PYTHONOPTIMIZE": "1"}):
        proc, _ = run_canary(server.port, env=env)
        assert proc.returncode == 1, (env, proc.stderr)
        assert "no text_output" in proc.stderr and "Traceback" not in proc.stderr
    assert "assert" not in canary_script(8000) and "assert" not in canary_script(8000, openai_model="m")


@pytest.mark.parametrize("server", ["huge"], indirect=True)
def test_canary_script_refuses_an_answer_over_its_limit(server: Server) -> None:
    proc, _ = run_canary(server.port)
    assert proc.returncode == 1 and "larger than 1048576 bytes" in proc.stderr


@pytest.mark.parametrize("server", ["drip"], indirect=True)
def test_canary_script_has_one_deadline_for_the_whole_request(server: Server) -> None:
    proc, seconds = run_canary(server.port, timeout_s=1.0)
    assert proc.returncode == 1 and "within 1 s" in proc.stderr
    assert seconds < 4  # the server would drip for 8 s: a per-socket timeout never fires


@pytest.mark.parametrize("server", ["ok"], indirect=True)
def test_canary_script_sends_the_key_from_the_environment_only(server: Server) -> None:
    assert KEY not in canary_script(server.port)
    proc, _ = run_canary(server.port, env={API_KEY_ENV: KEY})
    assert proc.returncode == 0
    assert server.headers[-1][TRITON_KEY_HEADER] == KEY and server.headers[-1]["authorization"] == f"Bearer {KEY}"
    proc, _ = run_canary(server.port, env={API_KEY_ENV: ""})
    assert proc.returncode == 0 and TRITON_KEY_HEADER not in server.headers[-1]


@pytest.mark.parametrize("server", ["huge"], indirect=True)
def test_health_canary_refuses_an_answer_over_its_limit(server: Server) -> None:
    probe = health.canary(f"http://127.0.0.1:{server.port}", timeout_s=10)
    assert not probe.ok and "larger than" in probe.detail
    probe = health.openai_canary(f"http://127.0.0.1:{server.port}", "m", timeout_s=10)
    assert not probe.ok and "larger than" in probe.detail


@pytest.mark.parametrize("server", ["drip"], indirect=True)
def test_health_canary_has_one_deadline_for_the_whole_request(server: Server) -> None:
    for probe_of in (lambda u: health.canary(u, timeout_s=1.0), lambda u: health.openai_canary(u, "m", timeout_s=1.0)):
        start = time.monotonic()
        probe = probe_of(f"http://127.0.0.1:{server.port}")
        assert not probe.ok and "within 1 s" in probe.detail
        assert time.monotonic() - start < 3


@pytest.mark.parametrize("server", ["ok"], indirect=True)
def test_health_sends_the_key_when_set(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(API_KEY_ENV, KEY)
    assert health.canary(f"http://127.0.0.1:{server.port}").ok
    assert server.headers[-1][TRITON_KEY_HEADER] == KEY and server.headers[-1]["authorization"] == f"Bearer {KEY}"
    monkeypatch.delenv(API_KEY_ENV)
    assert health.openai_canary(f"http://127.0.0.1:{server.port}", "m").ok
    assert "authorization" not in server.headers[-1]


@pytest.mark.parametrize("server", ["error"], indirect=True)
def test_health_canary_without_text_is_not_ok(server: Server) -> None:
    assert not health.canary(f"http://127.0.0.1:{server.port}").ok
