"""The one place that names the API key trtkv's clients send to a keyed server (the deploy files'
Triton restricted APIs, vLLM's key): read from the environment, never from a file trtkv writes,
never printed.

Every trtkv client (the canary in the pods, `trtkv status`, `trtkv bench`, the AIPerf/GenAI-Perf
cross-checks) sends both headers when the variable is set: a server ignores the one it does not
check.
"""

from __future__ import annotations

import os

API_KEY_ENV = "TRTKV_API_KEY"
# Triton's --http-restricted-api / --grpc-restricted-protocol key (lower case: gRPC)
TRITON_KEY_HEADER = "trtkv-api-key"
# in the deploy files' pods: the mounted Secret file holding the key
API_KEY_FILE_ENV = "TRTKV_API_KEY_FILE"
# vLLM reads its key from here as from --api-key (not on the command line, not in ps)
VLLM_KEY_ENV = "VLLM_API_KEY"


def api_key() -> str | None:
    """The key from TRTKV_API_KEY (None when unset or blank)."""
    key = os.environ.get(API_KEY_ENV, "").strip()
    return key or None


def auth_headers() -> dict[str, str]:
    """HTTP headers (and gRPC metadata) carrying the key: Triton's restricted-API header and
    OpenAI's bearer token."""
    key = api_key()
    return {} if key is None else {TRITON_KEY_HEADER: key, "Authorization": f"Bearer {key}"}


def redact(text: str) -> str:
    """`text` with the key (when one is set) replaced, for logs and results that quote a command or
    a reply."""
    key = api_key()
    return text.replace(key, "***") if key else text
