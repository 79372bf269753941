"""Is the recipe's server serving? Not just "ready": a real one-token inference through the served
model (the ensemble, or the llmapi layout's tensorrt_llm: the canary).

Triton keeps answering ready while a model instance's stub is dead and part of the requests fail;
only an inference shows it. `trtkv status RECIPE` runs the checks below; a supervisor and the
container health check can use the same canary (`canary`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from trtkv.contracts.artifacts import ServerRecord
from trtkv.contracts.interface import ENSEMBLE, ModelInterface
from trtkv.core.httpcall import request
from trtkv.recipe import Recipe
from trtkv.recipe.layout import serve_dir
from trtkv.serving.teardown import claim


@dataclass
class Probe:
    ok: bool
    seconds: float
    detail: str


@dataclass
class Health:
    """healthy: alive, ready and every canary answered; degraded: alive and ready but a canary
    failed; down: not alive or not ready; absent: no server recorded for the recipe."""

    state: str
    server: ServerRecord | None
    checks: dict[str, Any] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return {"healthy": 0, "degraded": 1, "down": 1, "restarting": 1, "absent": 2}[self.state]


MAX_RESPONSE_BYTES = 1 << 20  # a ready answer or a one-token inference is a few hundred bytes


def _http(url: str, body: dict[str, Any] | None, timeout_s: float) -> tuple[int, str]:
    """(status, body text) of one request within one deadline, at most MAX_RESPONSE_BYTES
    (trtkv.core.httpcall)."""
    answer = request(url, body, timeout_s=timeout_s, max_bytes=MAX_RESPONSE_BYTES)
    return answer.status, answer.text


def canary(http_url: str, interface: ModelInterface = ENSEMBLE, timeout_s: float = 60.0) -> Probe:
    """One real inference: POST /v2/models/<model>/generate with a one-token request; ok when text
    comes back."""
    start = time.monotonic()
    try:
        status, text = _http(
            f"{http_url}/v2/models/{interface.model}/generate",
            interface.body("Hello", 1),
            timeout_s,
        )
    except OSError as exc:
        return Probe(False, time.monotonic() - start, f"{type(exc).__name__}: {exc}")
    seconds = time.monotonic() - start
    if status != 200:
        return Probe(False, seconds, f"HTTP {status}: {text[:200]}")
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        parsed = None
    answer = parsed.get("text_output") if isinstance(parsed, dict) else None
    return Probe(
        answer is not None, seconds, f"text_output {answer!r}" if answer is not None else text[:200]
    )


def openai_canary(http_url: str, model: str, timeout_s: float = 60.0) -> Probe:
    """One real inference on an OpenAI-compatible server: POST /v1/completions, one token."""
    start = time.monotonic()
    body = {"model": model, "prompt": "Hello", "max_tokens": 1, "temperature": 0}
    try:
        status, text = _http(f"{http_url}/v1/completions", body, timeout_s)
    except OSError as exc:
        return Probe(False, time.monotonic() - start, f"{type(exc).__name__}: {exc}")
    seconds = time.monotonic() - start
    try:
        answer = json.loads(text)["choices"][0]["text"] if status == 200 else None
    except (json.JSONDecodeError, KeyError, IndexError, TypeError):
        answer = None
    return Probe(
        answer is not None,
        seconds,
        f"text {answer!r}" if answer is not None else f"HTTP {status}: {text[:200]}",
    )


def default_canaries(recipe: Recipe, frontend: str) -> int:
    """Triton: two per model instance (round-robin then reaches every instance, and a dead one fails
    some); an OpenAI server (vLLM, trtllm-serve) runs one engine: one. Each canary is a real engine
    step that competes with the traffic being served."""
    return 2 * recipe.triton.instance_count if frontend == "tritonserver" else 1


def check(recipe: Recipe, canaries: int | None = None, timeout_s: float = 60.0) -> Health:
    """The recorded server's state: process alive, its ready endpoint, then `canaries` one-token
    inferences (default: `default_canaries`; 0: none, alive and ready only —
    `checks["passive"]`)."""
    server = ServerRecord.load(serve_dir(recipe))
    if server is None:
        return Health("absent", None)
    http = f"http://{server.client_host}:{server.http_port}"
    proof = claim(server)  # proven: the recorded start time (trtkv.serving.teardown)
    checks: dict[str, Any] = {"alive": proof.leader, **({"seen": proof.seen} if proof.seen else {})}
    if not checks["alive"]:
        return Health("down", server, checks)
    frontend = server.frontend
    # vLLM and trtllm-serve: /health
    ready_path = "/v2/health/ready" if frontend == "tritonserver" else "/health"
    try:
        status, _ = _http(f"{http}{ready_path}", None, 5.0)
    except OSError as exc:
        status = 0
        checks["ready_error"] = str(exc)
    checks["ready"] = status == 200
    if not checks["ready"]:
        return Health("down", server, checks)
    from trtkv.backends import for_recipe

    count = default_canaries(recipe, frontend) if canaries is None else canaries
    if count <= 0:
        checks["passive"] = True
        return Health("healthy", server, checks)
    repo = for_recipe(recipe).repo
    if frontend == "tritonserver" and repo is not None:
        interface = repo.interface
        probes = [canary(http, interface, timeout_s=timeout_s) for _ in range(count)]
    else:
        model = server.served_model_name or recipe.name
        probes = [openai_canary(http, model, timeout_s=timeout_s) for _ in range(count)]
    checks["canaries"] = [probe.__dict__ for probe in probes]
    return Health("healthy" if all(p.ok for p in probes) else "degraded", server, checks)
