"""One entry point per protocol: check an endpoint and make its sessions (Triton gRPC/HTTP:
trtkv.bench.transport.client; OpenAI: trtkv.bench.transport.openai)."""

from __future__ import annotations

from collections.abc import Callable

from trtkv.bench.transport.client import Endpoint, Session, check_triton, triton_session_factory
from trtkv.bench.transport.openai import OpenAISession, check_openai
from trtkv.recipe.enums import Protocol


def check_endpoint(ep: Endpoint, timeout_s: float = 10.0) -> Endpoint:
    """The server answers and serves the model, else a TrtkvError naming the URL (and what to
    do)."""
    return (
        check_openai(ep, timeout_s)
        if ep.protocol is Protocol.OPENAI
        else check_triton(ep, timeout_s)
    )


def session_factory(ep: Endpoint) -> Callable[[], Session]:
    if ep.protocol is Protocol.OPENAI:
        return lambda: OpenAISession(ep)
    return triton_session_factory(ep)
