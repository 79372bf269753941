"""Streaming clients for a served Triton model (the ensemble, or the llmapi layout's tensorrt_llm):
gRPC bidirectional streaming (tritonclient) or HTTP generate_stream (SSE).

A session carries one request at a time, so every response (and every error, which gRPC streams
deliver without a request id) belongs to the request in flight. The response callback only
timestamps and keeps the text; tokens are counted after the run, off the hot path.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trtkv.bench.transport.http1 import Connection, Events, ProtocolError
from trtkv.bench.transport.http1_fetch import CHECK_BYTES, event_json, http_request, strict
from trtkv.bench.transport.stream import shared_loop, stream
from trtkv.bench.transport.triton_answers import grpc_channel_args, model_config, too_big
from trtkv.contracts.bench_doc import CANCELLED, ERROR, OK, TIMEOUT, RequestRecord, now_ns
from trtkv.contracts.interface import ENSEMBLE, LLMAPI, ModelInterface, detect
from trtkv.core.apikey import auth_headers
from trtkv.core.errors import TrtkvError
from trtkv.core.files import strict_json
from trtkv.core.httpcall import request
from trtkv.recipe.enums import Protocol

DEFAULT_MODEL = ENSEMBLE.model


@dataclass
class Endpoint:
    """Where and how to talk to the server; `inputs`/`max_batch_size` come from the model's
    config."""

    url: str  # host:port
    protocol: Protocol = Protocol.GRPC
    model: str = DEFAULT_MODEL
    inputs: dict[str, str] = field(default_factory=dict)  # name -> datatype (TYPE_ prefix stripped)
    max_batch_size: int = 0
    # which tensors carry what (detected from the model's inputs)
    interface: ModelInterface = ENSEMBLE
    endpoint_type: str = "completions"  # protocol openai: completions or chat
    source: str = ""  # where the URL came from (--url, server.json, recipe)

    def __post_init__(self) -> None:
        # one of the closed set, also when given as its value ("grpc")
        self.protocol = Protocol(self.protocol)

    @property
    def display(self) -> str:
        return f"{self.protocol.value}://{self.url}"


@dataclass
class SamplingParams:
    max_tokens: int
    temperature: float = 0.0
    top_k: int = 1
    top_p: float = 1.0


# --------------------------------------------------------------------------------------------------
# Readiness


def check_triton(ep: Endpoint, timeout_s: float = 10.0) -> Endpoint:
    """Server live and model ready, else a TrtkvError naming the URL; fills the model's inputs from
    its config."""
    try:
        if ep.protocol is Protocol.GRPC:
            config = _grpc_config(ep, timeout_s)
        else:
            config = _http_config(ep, timeout_s)
    except TrtkvError:
        raise
    except Exception as exc:  # noqa: BLE001 - connection errors come in many types; all mean "not reachable"
        raise TrtkvError(
            f"no Triton server answers at {ep.display} ({type(exc).__name__}: {first_line(exc)}). "
            f"Next: start it with `trtkv serve RECIPE` (or `make serve`), or pass --url HOST:PORT "
            f"(URL from {ep.source or 'default'})."
        ) from None
    # read in type: a wrong one is one error line naming the server and the field
    ep.max_batch_size, ep.inputs = model_config(config, f"{ep.display}, model {ep.model!r}")
    interface = detect(ep.inputs)
    if interface is None:
        raise TrtkvError(
            f"model {ep.model!r} at {ep.display} has inputs {sorted(ep.inputs)[:8]}; trtkv bench "
            f"needs the ensemble interface (text_input, {ENSEMBLE.max_tokens}, {ENSEMBLE.stream} "
            f"-> text_output) or the llmapi one (text_input, {LLMAPI.max_tokens}, {LLMAPI.stream} "
            "-> text_output)."
        )
    ep.interface = interface
    return ep


def _not_ready(ep: Endpoint, index: list[dict[str, Any]]) -> TrtkvError:
    states = ", ".join(f"{m.get('name')}={m.get('state', '?')}" for m in index) or "none loaded"
    return TrtkvError(
        f"the server at {ep.display} is up but model {ep.model!r} is not ready (models: {states}). "
        f"Next: check the server log (engines/<recipe>/serve/), or wait until it has loaded."
    )


def _grpc_config(ep: Endpoint, timeout_s: float) -> dict[str, Any]:
    import tritonclient.grpc as grpcclient

    # one deadline for every call of the check, answers bounded in size
    deadline = time.monotonic() + timeout_s

    def left() -> float:
        return max(0.001, deadline - time.monotonic())

    client = grpcclient.InferenceServerClient(ep.url, channel_args=grpc_channel_args(CHECK_BYTES))
    try:
        key = auth_headers() or None  # the deploy files key Triton's model-repository API
        if not client.is_server_live(headers=key, client_timeout=left()):
            raise TrtkvError(f"the Triton server at {ep.display} answers but is not live.")
        if not client.is_model_ready(ep.model, headers=key, client_timeout=left()):
            index = client.get_model_repository_index(
                headers=key, as_json=True, client_timeout=left()
            ).get("models", [])
            raise _not_ready(ep, index)
        config: dict[str, Any] = client.get_model_config(
            ep.model, headers=key, as_json=True, client_timeout=left()
        )["config"]
        return config
    finally:
        client.close()


def _http_config(ep: Endpoint, timeout_s: float) -> dict[str, Any]:
    """Triton's HTTP API (live, model ready, its config) within one deadline, each answer bounded
    (trtkv.core.httpcall through the bench's strict parser)."""
    deadline = time.monotonic() + timeout_s

    def call(method: str, path: str) -> tuple[int, Any]:
        try:
            answer = request(
                f"{ep.url}{path}",
                method=method,
                timeout_s=max(0.001, deadline - time.monotonic()),
                max_bytes=CHECK_BYTES,
                transport=strict(expect_type=None),
            )
        except TimeoutError:
            raise TimeoutError(f"no whole answer within {timeout_s:g} s") from None
        try:
            return answer.status, strict_json(answer.body) if answer.body else None
        except ValueError:
            return answer.status, None

    if call("GET", "/v2/health/live")[0] != 200:
        raise TrtkvError(f"the Triton server at {ep.display} answers but is not live.")
    if call("GET", f"/v2/models/{ep.model}/ready")[0] != 200:
        index = call("POST", "/v2/repository/index")[1]
        raise _not_ready(
            ep, [m for m in index if isinstance(m, dict)] if isinstance(index, list) else []
        )
    status, config = call("GET", f"/v2/models/{ep.model}/config")
    if status != 200 or not isinstance(config, dict):
        raise TrtkvError(
            f"the Triton server at {ep.display} answered {status} for model {ep.model!r}'s config."
        )
    return config


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


# --------------------------------------------------------------------------------------------------
# Sessions


class Session:
    """One connection carrying one request at a time; `run` fills the record and returns when it is
    done."""

    def run(
        self, record: RequestRecord, prompt: str, params: SamplingParams, timeout_s: float
    ) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


def _bytes_element(raw: bytes) -> str:
    """The first element of a serialized BYTES tensor (4-byte little-endian length, then the
    bytes)."""
    if len(raw) < 4:
        return ""
    n = int.from_bytes(raw[:4], "little")
    return raw[4 : 4 + n].decode("utf-8", errors="replace")


class GrpcSession(Session):
    """tritonclient gRPC bidirectional stream to a decoupled model, with empty final responses
    enabled."""

    def __init__(self, ep: Endpoint) -> None:
        import numpy as np
        import tritonclient.grpc as grpcclient

        self._np, self._grpc, self.ep = np, grpcclient, ep
        # every answer bounded as HTTP's (tritonclient's default takes up to 2 GiB)
        self._client = grpcclient.InferenceServerClient(ep.url, channel_args=grpc_channel_args())
        self._pending: RequestRecord | None = None
        self._done = threading.Event()
        # gRPC metadata: the API key when $TRTKV_API_KEY is set
        self._headers = auth_headers() or None
        self._client.start_stream(callback=self._on_response, headers=self._headers)
        self._count = 0

    def _on_response(self, result: Any, error: Any) -> None:
        t = now_ns()
        rec = self._pending
        if rec is None:
            return
        if error is not None:
            rec.status, rec.error, rec.end_ns = ERROR, too_big(first_line(error)), t
            self._done.set()
            return
        resp = result.get_response()
        index = next((i for i, out in enumerate(resp.outputs) if out.name == "text_output"), None)
        if index is not None and index < len(resp.raw_output_contents):
            text = self.ep.interface.new_text(
                _bytes_element(resp.raw_output_contents[index]), "".join(rec.response_texts)
            )
            # a cumulative response without new text adds no token
            if text or not self.ep.interface.cumulative:
                rec.response_ns.append(t)
                rec.response_texts.append(text)
        if resp.parameters["triton_final_response"].bool_param:
            rec.status, rec.end_ns = OK, t
            self._done.set()

    def _inputs(self, prompt: str, params: SamplingParams) -> list[Any]:
        np, grpcclient, ep = self._np, self._grpc, self.ep
        lead = [1] if ep.max_batch_size > 0 else []
        i = ep.interface
        values: dict[str, tuple[Any, str]] = {
            "text_input": (np.array([prompt.encode("utf-8")], dtype=np.object_), "BYTES"),
            i.max_tokens: (np.array([params.max_tokens], dtype=np.int32), "INT32"),
            i.stream: (np.array([True], dtype=bool), "BOOL"),
            i.temperature: (np.array([params.temperature], dtype=np.float32), "FP32"),
            i.top_k: (np.array([params.top_k], dtype=np.int32), "INT32"),
            i.top_p: (np.array([params.top_p], dtype=np.float32), "FP32"),
        }
        inputs = []
        for name, (arr, dtype) in values.items():
            if name not in ep.inputs:
                continue
            arr = arr.reshape(lead + [1])
            item = grpcclient.InferInput(name, list(arr.shape), dtype)
            item.set_data_from_numpy(arr)
            inputs.append(item)
        return inputs

    def run(
        self, record: RequestRecord, prompt: str, params: SamplingParams, timeout_s: float
    ) -> None:
        inputs = self._inputs(prompt, params)
        self._count += 1
        self._done.clear()
        self._pending = record
        record.send_ns = now_ns()
        try:
            self._client.async_stream_infer(
                self.ep.model,
                inputs,
                request_id=record.request_id,
                enable_empty_final_response=True,
            )
        except Exception as exc:  # noqa: BLE001 - a broken stream: the request failed, a new stream is opened
            record.status, record.error, record.end_ns = ERROR, first_line(exc), now_ns()
            self._restart()
            return
        try:
            finished = self._wait(timeout_s)
        except KeyboardInterrupt:
            record.status, record.error, record.end_ns = CANCELLED, "interrupted (Ctrl-C)", now_ns()
            self._pending = None
            raise
        if not finished:
            record.status, record.error, record.end_ns = (
                TIMEOUT,
                f"no final response within {timeout_s:g} s",
                now_ns(),
            )
            self._restart()
        elif record.status == ERROR:
            self._restart()
        self._pending = None

    def _wait(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not self._done.wait(timeout=min(0.5, max(0.0, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                return False
        return True

    def _restart(self) -> None:
        """Cancel what is in flight and open a fresh stream (late responses of the old one are
        dropped)."""
        self._pending = None
        self._client.stop_stream(cancel_requests=True)
        self._client.start_stream(callback=self._on_response, headers=self._headers)

    def close(self) -> None:
        self._pending = None
        self._client.stop_stream(cancel_requests=True)
        self._client.close()


class TritonEvents:
    """Triton's generate_stream events: `data: {"text_output": ...}` per response; the body's end
    ends the request. As OpenAIEvents: raw events while streaming (errors parsed at once), texts in
    decode() after the request."""

    def __init__(self, ep: Endpoint, record: RequestRecord) -> None:
        self.interface, self.record = ep.interface, record
        self.raw: list[tuple[int, bytes]] = []

    def on_line(self, line: bytes, t_ns: int) -> bool:
        if not line.startswith(b"data:"):
            return False
        payload = line[5:].strip()
        if b'"error"' in payload or not payload.startswith(b"{"):  # maybe an error: look now
            try:
                event = json.loads(payload)
            except ValueError:
                event = {"error": f"not a JSON event: {payload[:120]!r}"}
            if not isinstance(event, dict) or "error" in event:
                error = event.get("error") if isinstance(event, dict) else event
                self.record.status, self.record.error, self.record.end_ns = (
                    ERROR,
                    str(error)[:300],
                    t_ns,
                )
                return True
        self.raw.append((t_ns, payload))
        return False

    def on_end(self, t_ns: int) -> None:
        self.record.status, self.record.end_ns = OK, t_ns

    def decode(self) -> None:
        rec, interface = self.record, self.interface
        for t_ns, payload in self.raw:
            text = event_json(payload).get("text_output")
            if isinstance(text, list):
                text = text[0] if text else ""
            new = interface.new_text(str(text or ""), "".join(rec.response_texts))
            if new or not interface.cumulative:
                rec.response_ns.append(t_ns)
                rec.response_texts.append(new)
        self.raw = []


class HttpSession(Session):
    """HTTP `POST v2/models/<model>/generate_stream` (server-sent events) on one keep-alive
    connection, read by the process's shared stream loop (trtkv.bench.transport.stream)."""

    def __init__(self, ep: Endpoint) -> None:
        self.ep = ep
        host, _, port = ep.url.rpartition(":")
        self._conn = Connection(host or "127.0.0.1", int(port))

    def _body(self, prompt: str, params: SamplingParams) -> bytes:
        body = self.ep.interface.body(
            prompt,
            params.max_tokens,
            stream=True,
            temperature=params.temperature,
            top_k=params.top_k,
            top_p=params.top_p,
        )
        return json.dumps({k: v for k, v in body.items() if k in self.ep.inputs}).encode()

    def _path(self) -> str:
        return f"/v2/models/{self.ep.model}/generate_stream"

    def _events(self, record: RequestRecord) -> Events:
        return TritonEvents(self.ep, record)

    def run(
        self, record: RequestRecord, prompt: str, params: SamplingParams, timeout_s: float
    ) -> None:
        cpu0 = time.thread_time_ns()
        conn = self._conn
        request = http_request(
            "POST",
            conn.host,
            conn.port,
            self._path(),
            self._body(prompt, params),
            {"Content-Type": "application/json", "Accept": "text/event-stream", **auth_headers()},
        )
        events = self._events(record)
        record.send_ns = now_ns()
        try:
            stream(conn, request, record, events, timeout_s)
        finally:
            try:
                events.decode()
            # an event that is not a JSON object: this request failed, named
            except ProtocolError as exc:
                record.status, record.error = ERROR, f"bad HTTP response: {exc}"
                record.end_ns = record.end_ns or now_ns()
            # this thread's part; the loop adds its own
            record.client_cpu_ns += time.thread_time_ns() - cpu0

    def close(self) -> None:
        if self._conn.sock is not None:
            shared_loop().close(self._conn)


def triton_session_factory(ep: Endpoint) -> Callable[[], Session]:
    return (lambda: GrpcSession(ep)) if ep.protocol is Protocol.GRPC else (lambda: HttpSession(ep))
