"""The canary as a container health check: one real one-token inference from inside the container (Triton keeps
answering "ready" while a model instance is dead; only an inference shows it). `trtkv status` runs the same request
from outside (trtkv.health).

The check is a small python3 program, passed to `docker run --health-cmd` base64-encoded (`echo ... | base64 -d |
python3`), so no quoting survives two shells; `canary_script` returns it readable.
"""

from __future__ import annotations

import base64
import json

from trtkv.interface import ENSEMBLE, ModelInterface


def canary_script(port: int, interface: ModelInterface = ENSEMBLE, openai_model: str | None = None) -> str:
    """A python3 program: one one-token inference on 127.0.0.1:<port>; exit status 0 only when text comes back.
    `openai_model`: POST /v1/completions with that model (vLLM, trtllm-serve) instead of Triton's generate."""
    if openai_model is not None:
        url = f"http://127.0.0.1:{port}/v1/completions"
        body: dict[str, object] = {"model": openai_model, "prompt": "Hello", "max_tokens": 1, "temperature": 0}
        key = "choices"
    else:
        url = f"http://127.0.0.1:{port}/v2/models/{interface.model}/generate"
        body, key = interface.body("Hello", 1), "text_output"
    return ("import json, urllib.request as u\n"
            f"request = u.Request({json.dumps(url)}, data=json.dumps({json.dumps(body)}).encode(), "
            "headers={\"Content-Type\": \"application/json\"})\n"
            f"assert {json.dumps(key)} in json.load(u.urlopen(request, timeout=60))\n")


def health_cmd(script: str) -> str:
    """The --health-cmd shell line running `script` (base64: nothing to quote)."""
    return f"echo {base64.b64encode(script.encode()).decode()} | base64 -d | python3"


def docker_health_args(script: str, start_period_s: float) -> list[str]:
    """docker run flags running the canary every 30 s once the server had time to load (unhealthy after 3 misses)."""
    return ["--health-cmd", health_cmd(script), "--health-interval", "30s", "--health-timeout", "60s",
            "--health-retries", "3", "--health-start-period", f"{int(start_period_s)}s"]



