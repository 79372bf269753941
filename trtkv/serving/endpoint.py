"""`trtkv status --url URL`: a deployed endpoint checked from outside, whoever started it (a
Kubernetes Service, a Slurm job, another machine): Triton (GET /v2/health/ready, the repository
index, a one-token generate) or any OpenAI-compatible server (GET /health, GET /v1/models, a
one-token /v1/completions). Every request is trtkv.core.httpcall's: one deadline for the whole
exchange, at most MAX_RESPONSE_BYTES of answer, the API key of $TRTKV_API_KEY when set; nothing is
started or bound here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from trtkv.contracts.interface import ENSEMBLE, LLMAPI, ModelInterface
from trtkv.core.errors import TrtkvError
from trtkv.core.httpcall import HttpError, Target, request
from trtkv.serving.health import MAX_RESPONSE_BYTES, canary, openai_canary

MAX_MODELS_SHOWN = 20  # a model list is shown up to this many names


@dataclass
class EndpointHealth:
    """healthy: the health endpoint answers 200, a model is listed and every canary answered;
    degraded: up, but a canary failed or no model answers; down: no health answer."""

    url: str
    kind: str  # "triton", "openai" or "unknown"
    state: str
    checks: dict[str, Any] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return 0 if self.state == "healthy" else 1


def _get(url: str, timeout_s: float, body: Any = None) -> tuple[int | None, str]:
    """(status, text) of one bounded request; (None, why) when no answer came."""
    try:
        answer = request(url, body, timeout_s=timeout_s, max_bytes=MAX_RESPONSE_BYTES)
    except OSError as exc:
        return None, f"{type(exc).__name__}: {exc}"
    return answer.status, answer.text


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def base_url(url: str) -> str:
    """The endpoint's root (http://host:port), checked where it enters; TrtkvError otherwise."""
    try:
        target = Target.parse(url.rstrip("/"))
    except HttpError as exc:
        raise TrtkvError(
            f"--url {url[:120]!r}: {exc}. Next: the server's HTTP address, e.g. --url "
            "http://my-service.trtkv:8000 (a port-forward: http://127.0.0.1:8000)."
        ) from None
    host = f"[{target.host}]" if ":" in target.host else target.host
    return f"http://{host}:{target.port}" + target.path.rstrip("/")


def _triton_models(base: str, timeout_s: float) -> tuple[list[str], list[ModelInterface]]:
    """(model names listed by the repository index, or the ready ones trtkv serves when the index
    is refused; the interfaces a canary can use, ensemble first)."""
    status, text = _get(f"{base}/v2/repository/index", timeout_s, body={})
    index = _json(text) if status == 200 else None
    names = (
        [str(m.get("name")) for m in index if isinstance(m, dict)]
        if isinstance(index, list)
        else []
    )
    usable = []
    for face in (ENSEMBLE, LLMAPI):
        ready, _ = _get(f"{base}/v2/models/{face.model}/ready", timeout_s)
        if ready == 200:
            usable.append(face)
            if face.model not in names:
                names.append(face.model)
    return names, usable


def check_endpoint(url: str, canaries: int = 1, timeout_s: float = 30.0) -> EndpointHealth:
    """Health, the model list and `canaries` one-token inferences (0: none) of the endpoint at
    `url`, each request within `timeout_s`."""
    base = base_url(url)
    checks: dict[str, Any] = {}
    status, text = _get(f"{base}/v2/health/ready", timeout_s)
    if status == 200:
        kind = "triton"
        names, faces = _triton_models(base, timeout_s)
        checks.update(health=True, models=names[:MAX_MODELS_SHOWN])
        probes = [canary(base, faces[0], timeout_s) for _ in range(canaries)] if faces else []
        if canaries and not faces:
            checks["canary_model"] = "none of ensemble, tensorrt_llm is ready: no canary"
    else:
        status, text = _get(f"{base}/health", timeout_s)
        if status is None or status != 200:
            return EndpointHealth(
                base, "unknown", "down", {"health": False, "detail": f"{status}: {text[:200]}"}
            )
        kind = "openai"
        listed = _json(_get(f"{base}/v1/models", timeout_s)[1])
        data = listed.get("data") if isinstance(listed, dict) else None
        names = [str(m.get("id")) for m in data if isinstance(m, dict)] if data else []
        checks.update(health=True, models=names[:MAX_MODELS_SHOWN])
        probes = (
            [openai_canary(base, names[0], timeout_s) for _ in range(canaries)] if names else []
        )
        if canaries and not names:
            checks["canary_model"] = "GET /v1/models listed no model: no canary"
    checks["canaries"] = [{"ok": p.ok, "seconds": p.seconds, "detail": p.detail} for p in probes]
    ok = bool(names) and all(p.ok for p in probes) and len(probes) == canaries
    return EndpointHealth(base, kind, "healthy" if ok else "degraded", checks)


def describe(result: EndpointHealth) -> list[str]:
    """The text `trtkv status --url` prints."""
    c = result.checks
    lines = [f"{result.url}: {result.state} ({result.kind})"]
    if not c.get("health"):
        return [*lines, f"  health: no 200 ({c.get('detail', '')})"]
    models = c.get("models") or []
    lines.append(f"  models: {', '.join(models) if models else 'none listed'}")
    if c.get("canary_model"):
        lines.append(f"  canary: {c['canary_model']}")
    for i, p in enumerate(c.get("canaries", []), 1):
        lines.append(
            f"  canary {i}: {'ok' if p['ok'] else 'FAILED'} in {p['seconds']:.2f} s ({p['detail']})"
        )
    return lines
