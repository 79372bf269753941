"""Small clients for the e2e tests: gRPC streaming and HTTP generate against the `ensemble` model."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any


@dataclass
class StreamResult:
    parts: list[str] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0
    first_part_s: float | None = None

    @property
    def text(self) -> str:
        return "".join(self.parts)


def _inputs(prompt: str, max_tokens: int, stream: bool, extra: dict[str, Any] | None = None) -> list[Any]:
    from benchmarks.soak import inputs

    return inputs(prompt, max_tokens, extra, stream)


def grpc_stream(url: str, prompt: str, max_tokens: int, timeout_s: float = 120.0,
                extra: dict[str, Any] | None = None) -> StreamResult:
    """One streaming request over gRPC; every response's text_output in order."""
    import tritonclient.grpc as grpcclient

    out = StreamResult()
    done = threading.Event()
    start = time.time()

    def callback(result: Any, error: Any) -> None:  # tritonclient passes keywords
        if error is not None:
            out.error = str(error)
            done.set()
            return
        text = result.as_numpy("text_output")
        if text is not None and text.size:
            if out.first_part_s is None:
                out.first_part_s = time.time() - start
            out.parts.append(text.reshape(-1)[0].decode("utf-8"))
        final = result.get_response().parameters.get("triton_final_response")
        if final is not None and final.bool_param:
            done.set()

    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=callback)
    try:
        client.async_stream_infer("ensemble", _inputs(prompt, max_tokens, True, extra),
                                  enable_empty_final_response=True)
        if not done.wait(timeout_s):
            out.error = f"no final response within {timeout_s} s"
    finally:
        client.stop_stream()
        client.close()
    out.seconds = time.time() - start
    return out


def http_generate(base_url: str, body: dict[str, Any], timeout_s: float = 120.0,
                  model: str = "ensemble") -> tuple[int, dict[str, Any]]:
    """POST /v2/models/<model>/generate; (status, JSON body)."""
    request = urllib.request.Request(f"{base_url}/v2/models/{model}/generate", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def http_generate_stream(base_url: str, body: dict[str, Any], timeout_s: float = 120.0, model: str = "ensemble",
                         stream_key: str = "stream") -> list[dict[str, Any]]:
    """POST /v2/models/<model>/generate_stream; the SSE events as dicts."""
    request = urllib.request.Request(f"{base_url}/v2/models/{model}/generate_stream",
                                     data=json.dumps({**body, stream_key: True}).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    events = []
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        for raw in response:
            line = raw.decode("utf-8").strip()
            if line.startswith("data:"):
                events.append(json.loads(line[5:]))
    return events
