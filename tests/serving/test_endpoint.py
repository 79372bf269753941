"""`trtkv status --url`: a deployed OpenAI-compatible endpoint checked from outside (health, model list, one-token
canary), every request bounded in time and bytes. The endpoint here is a small stdlib HTTP server answering as vLLM
does (its /health, /v1/models and /v1/completions shapes); the real tritonserver is checked in
tests/e2e/test_serve.py."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from trtkv.cli import main
from trtkv.serving.endpoint import check_endpoint


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # as the engines' servers answer (Content-Length, kept alive)
    mode = "ok"  # "ok", "drip" (a byte a second), "huge" (an answer over the bound), "no-model"

    def log_message(self, *_args: object) -> None:
        pass

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.mode == "drip" and self.path == "/v1/completions":
            for b in body:
                self.wfile.write(bytes([b]))
                self.wfile.flush()
                time.sleep(1.0)
            return
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path == "/health":
            self._send(200, b"")
        elif self.path == "/v1/models":
            data = [] if self.mode == "no-model" else [{"id": "llama", "object": "model"}]
            self._send(200, json.dumps({"object": "list", "data": data}).encode())
        else:
            self._send(404, b'{"detail": "Not Found"}')

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        if self.path != "/v1/completions" or body.get("model") != "llama" or body.get("max_tokens") != 1:
            self._send(400, b'{"error": "bad request"}')
        elif self.mode == "huge":
            self._send(200, b'{"choices": [{"text": "' + b"x" * (2 << 20) + b'"}]}')
        else:
            self._send(200, json.dumps({"choices": [{"text": " world"}]}).encode())


@pytest.fixture()
def endpoint() -> Iterator[tuple[str, type[Handler]]]:
    handler = type("H", (Handler,), {"mode": "ok"})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


def test_an_openai_endpoint_is_healthy_with_its_models_and_a_canary(endpoint: tuple[str, type[Handler]],
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    url, _ = endpoint
    assert main(["status", "--url", url + "/"]) == 0
    out = capsys.readouterr().out
    assert f"{url}: healthy (openai)" in out and "models: llama" in out and "canary 1: ok" in out
    assert main(["status", "--url", url, "--canaries", "0", "--json"]) == 0
    seen = json.loads(capsys.readouterr().out)
    assert seen["state"] == "healthy" and seen["checks"]["canaries"] == []


@pytest.mark.parametrize("mode, detail", [("drip", "within 3"), ("huge", "larger than"), ("no-model", None)])
def test_a_failing_endpoint_is_degraded_within_its_bounds(endpoint: tuple[str, type[Handler]], mode: str,
                                                          detail: str | None) -> None:
    url, handler = endpoint
    handler.mode = mode
    start = time.monotonic()
    result = check_endpoint(url, canaries=1, timeout_s=3.0)
    assert result.state == "degraded" and result.exit_code == 1
    assert time.monotonic() - start < 10  # the drip is cut at the deadline, not read to its end
    if detail is None:
        assert result.checks["models"] == [] and "listed no model" in result.checks["canary_model"]
    else:
        assert not result.checks["canaries"][0]["ok"] and detail in result.checks["canaries"][0]["detail"]


def test_a_closed_port_is_down_and_bad_arguments_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    from trtkv.core.process import free_ports

    port = free_ports(1)[0]
    assert main(["status", "--url", f"http://127.0.0.1:{port}", "--timeout", "2"]) == 1
    assert "down (unknown)" in capsys.readouterr().out
    assert main(["status", "--url", "https://x:1"]) != 0
    assert "is not http://" in capsys.readouterr().err
    assert main(["status"]) != 0
    assert "name a recipe" in capsys.readouterr().err
