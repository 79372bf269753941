"""The canary as a container health check: one real one-token inference from inside the container
(Triton keeps answering "ready" while a model instance is dead; only an inference shows it). `trtkv
status` runs the same request from outside (trtkv.serving.health).

The check is a small python3 program, passed to `docker run --health-cmd` base64-encoded (`echo ...
| base64 -d | python3`), so no quoting survives two shells; `canary_script` returns it readable. It
decides with explicit exits, never `assert` (PYTHONOPTIMIZE would make an assert pass always), reads
at most CANARY_MAX_BYTES of the answer and gives the whole request (connect, send, headers, body)
one deadline: a server that drips bytes fails it too. It sends the API key of $TRTKV_API_KEY
(trtkv.core.apikey), or of the file $TRTKV_API_KEY_FILE names (the pods mount the key's Secret as a
file), when the container has one, read when it runs, never written in the script.
"""

from __future__ import annotations

import base64
import json

from trtkv.contracts.interface import ENSEMBLE, ModelInterface
from trtkv.core.apikey import API_KEY_ENV, API_KEY_FILE_ENV, TRITON_KEY_HEADER

# the whole request; under docker's --health-timeout and the probes' timeoutSeconds (60 s)
CANARY_TIMEOUT_S = 50.0
CANARY_MAX_BYTES = 1 << 20  # a one-token answer is a few hundred bytes


def canary_script(
    port: int,
    interface: ModelInterface = ENSEMBLE,
    openai_model: str | None = None,
    timeout_s: float = CANARY_TIMEOUT_S,
) -> str:
    """A python3 program: one one-token inference on 127.0.0.1:<port>; exit status 0 only when text
    comes back. `openai_model`: POST /v1/completions with that model (vLLM, trtllm-serve) instead of
    Triton's generate."""
    if openai_model is not None:
        path = "/v1/completions"
        body: dict[str, object] = {
            "model": openai_model,
            "prompt": "Hello",
            "max_tokens": 1,
            "temperature": 0,
        }
        key = "choices"
    else:
        path = f"/v2/models/{interface.model}/generate"
        body, key = interface.body("Hello", 1), "text_output"
    return (
        "import http.client, json, os, signal, sys\n"
        "def expired(*_):\n"
        f"    raise TimeoutError('no whole answer within {timeout_s:g} s')\n"
        "signal.signal(signal.SIGALRM, expired)\n"
        f"signal.setitimer(signal.ITIMER_REAL, {timeout_s!r})\n"
        "headers = {'Content-Type': 'application/json'}\n"
        f"key = os.environ.get({json.dumps(API_KEY_ENV)}, '').strip()\n"
        f"if not key and os.environ.get({json.dumps(API_KEY_FILE_ENV)}):\n"
        f"    with open(os.environ[{json.dumps(API_KEY_FILE_ENV)}]) as f:\n"
        "        key = f.read(4096).strip()\n"
        "if key:\n"
        f"    headers.update({{{json.dumps(TRITON_KEY_HEADER)}: key, 'Authorization': 'Bearer ' + "
        "key})\ntry:\n"
        f"    conn = http.client.HTTPConnection('127.0.0.1', {int(port)}, timeout={timeout_s!r})\n"
        f"    conn.request('POST', {json.dumps(path)}, {json.dumps(json.dumps(body))}, headers)\n"
        "    response = conn.getresponse()\n"
        f"    data = response.read({CANARY_MAX_BYTES + 1})\n"
        "    if response.status != 200:\n"
        "        sys.exit(f'canary: HTTP {response.status}: {data[:200]!r}')\n"
        f"    if len(data) > {CANARY_MAX_BYTES}:\n"
        f"        sys.exit('canary: the answer is larger than {CANARY_MAX_BYTES} bytes')\n"
        "    answer = json.loads(data)\n"
        "except Exception as exc:\n"
        "    sys.exit(f'canary: {type(exc).__name__}: {exc}')\n"
        f"if not isinstance(answer, dict) or {json.dumps(key)} not in answer:\n"
        f"    sys.exit('canary: no {key} in the answer: ' + repr(data[:200]))\n"
    )


def health_cmd(script: str) -> str:
    """The --health-cmd shell line running `script` (base64: nothing to quote)."""
    return f"echo {base64.b64encode(script.encode()).decode()} | base64 -d | python3"


def docker_health_args(script: str, start_period_s: float) -> list[str]:
    """docker run flags running the canary every 30 s once the server had time to load (unhealthy
    after 3 misses)."""
    return [
        "--health-cmd",
        health_cmd(script),
        "--health-interval",
        "30s",
        "--health-timeout",
        "60s",
        "--health-retries",
        "3",
        "--health-start-period",
        f"{int(start_period_s)}s",
    ]
