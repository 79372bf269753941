"""The OpenAI protocol for `trtkv bench`: streaming `/v1/completions` or `/v1/chat/completions`
(server-sent events) against any OpenAI-compatible server (vLLM, `trtllm-serve`, Triton's OpenAI
frontend).

One keep-alive HTTP connection per session, one request at a time, read by the shared stream loop
(trtkv.bench.transport.stream). Each SSE `data:` event with text is a response (its text is the new
text: `choices[0].text`, or `choices[0].delta.content` for chat); `data: [DONE]` ends the request; a
non-200 status or an event with `error` fails it. Token counts come from the model's tokenizer after
the run, as for the other protocols; the usage the server reports (`stream_options.include_usage`)
is kept to compare.
"""

from __future__ import annotations

import json
from typing import Any

from trtkv.bench.transport.client import Endpoint, HttpSession, SamplingParams, first_line
from trtkv.bench.transport.http1 import Events, ProtocolError
from trtkv.bench.transport.http1_fetch import CHECK_BYTES, event_json, strict
from trtkv.contracts.bench_doc import ERROR, OK, RequestRecord
from trtkv.core.errors import TrtkvError
from trtkv.core.files import strict_json
from trtkv.core.httpcall import request

ENDPOINT_TYPES = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


def _get_json(ep: Endpoint, path: str, timeout_s: float) -> tuple[int, Any]:
    """GET `path`: (status, parsed body); one overall deadline and a size cap (trtkv.core.httpcall
    through the bench's strict parser, http1_fetch.strict), strict JSON."""
    answer = request(
        f"{ep.url}{path}", timeout_s=timeout_s, max_bytes=CHECK_BYTES, transport=strict()
    )
    try:
        return answer.status, strict_json(answer.body) if answer.body else None
    except ValueError:
        return answer.status, answer.text


def check_openai(ep: Endpoint, timeout_s: float = 10.0) -> Endpoint:
    """The server answers /v1/models and serves ep.model (or, when none was named, its only/first
    model); one deadline of `timeout_s` for the whole check and at most http1_fetch.CHECK_BYTES of
    answer."""
    try:
        status, body = _get_json(ep, "/v1/models", timeout_s)
    except ProtocolError as exc:
        raise TrtkvError(
            f"http://{ep.url}/v1/models did not answer as an OpenAI-compatible server does "
            f"({exc}). Next: check --url (URL from {ep.source or 'default'})."
        ) from None
    except OSError as exc:
        raise TrtkvError(
            f"no OpenAI-compatible server answers at http://{ep.url} ({type(exc).__name__}: "
            f"{first_line(exc)}). Next: start it (`trtkv serve RECIPE`), or pass --url HOST:PORT "
            f"(URL from {ep.source or 'default'})."
        ) from None
    if status != 200 or not isinstance(body, dict):
        raise TrtkvError(
            f"http://{ep.url}/v1/models answered {status}: {str(body)[:200]}; not an "
            "OpenAI-compatible server (or not ready yet)."
        )
    data = body.get("data")
    served = [
        str(m.get("id"))[:200]
        for m in (data if isinstance(data, list) else [])
        if isinstance(m, dict)
    ]
    if not ep.model:
        if not served:
            raise TrtkvError(f"http://{ep.url}/v1/models lists no model.")
        ep.model = served[0]
    elif ep.model not in served:
        raise TrtkvError(
            f"model {ep.model!r} is not served at http://{ep.url}; it serves {served[:20]}. Next: "
            f"--model {served[0] if served else 'NAME'}."
        )
    return ep


def request_body(ep: Endpoint, prompt: str, params: SamplingParams) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": ep.model,
        "max_tokens": params.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": params.temperature,
        "top_p": params.top_p,
    }
    # not in OpenAI's schema: only if it matters
    if params.top_k > 1 or (params.top_k == 1 and params.temperature > 0):
        body["top_k"] = params.top_k
    if ep.endpoint_type == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return body


def event_text(event: dict[str, Any], chat: bool) -> str:
    choices = event.get("choices") or []
    if not choices:
        return ""
    choice = choices[0]
    if chat:
        return str((choice.get("delta") or {}).get("content") or "")
    return str(choice.get("text") or "")


class OpenAIEvents:
    """OpenAI's streamed events: text per event, `data: [DONE]` ends the request, an `error` event
    fails it.

    While streaming only the arrival time and the raw event are kept (and error events parsed);
    decode() turns them into texts after the request, in the worker thread, so the shared loop stays
    quick between events."""

    def __init__(self, record: RequestRecord, chat: bool) -> None:
        self.record, self.chat = record, chat
        self.raw: list[tuple[int, bytes]] = []

    def on_line(self, line: bytes, t_ns: int) -> bool:
        if not line.startswith(b"data:"):
            return False
        payload = line[5:].strip()
        if payload == b"[DONE]":
            self.record.status, self.record.end_ns = OK, t_ns
            return True
        if b'"error"' in payload or not payload.startswith(b"{"):  # maybe an error: look now
            error = _event_error(payload)
            if error is not None:
                self.record.status, self.record.error, self.record.end_ns = ERROR, error[:300], t_ns
                return True
        self.raw.append((t_ns, payload))
        return False

    def on_end(self, t_ns: int) -> None:
        self.record.status, self.record.error, self.record.end_ns = (
            ERROR,
            "the stream ended without [DONE]",
            t_ns,
        )

    def decode(self) -> None:
        rec = self.record
        for t_ns, payload in self.raw:
            event = event_json(payload)
            usage = event.get("usage")
            if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
                rec.server_tokens = int(usage["completion_tokens"])
            text = event_text(event, self.chat)
            if text:
                rec.response_ns.append(t_ns)
                rec.response_texts.append(text)
        self.raw = []


def _event_error(payload: bytes) -> str | None:
    """The error an event carries (an `error` field, `object: error`, or not a JSON object at all),
    else None."""
    try:
        event = json.loads(payload)
    except ValueError:
        return f"not a JSON event: {payload[:120]!r}"
    if not isinstance(event, dict):
        return f"not a JSON object: {payload[:120]!r}"
    if "error" not in event and event.get("object") != "error":
        return None
    error = event.get("error", event)
    return str(error.get("message", error) if isinstance(error, dict) else error)


class OpenAISession(HttpSession):
    """Streaming completions over one keep-alive HTTP connection (HttpSession's request handling and
    shared stream loop, with OpenAI's path, body and events)."""

    def _path(self) -> str:
        return ENDPOINT_TYPES[self.ep.endpoint_type]

    def _body(self, prompt: str, params: SamplingParams) -> bytes:
        return json.dumps(request_body(self.ep, prompt, params)).encode()

    def _events(self, record: RequestRecord) -> Events:
        return OpenAIEvents(record, self.ep.endpoint_type == "chat")
