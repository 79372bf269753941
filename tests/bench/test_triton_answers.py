"""What the bench takes from a Triton server (issue 48): a model config of the wrong JSON types is one error line
naming the server and the field (it was a traceback), and over gRPC an answer over the HTTP parser's 64 MiB bound fails
its request with that reason (tritonclient sets no receive limit: a 200 MB answer was an ok request). Against a local
HTTP server answering Triton's endpoints, and an in-process gRPC server speaking Triton's own service definition."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import pytest

from trtkv.bench.transport.client import Endpoint, GrpcSession, SamplingParams, check_triton
from trtkv.bench.transport.triton_answers import GRPC_RESPONSE_BYTES
from trtkv.contracts.bench_doc import ERROR, OK, RequestRecord
from trtkv.core.errors import TrtkvError

GOOD = {"max_batch_size": 0, "input": [{"name": "text_input", "data_type": "TYPE_STRING"},
                                       {"name": "max_tokens", "data_type": "TYPE_INT32"},
                                       {"name": "stream", "data_type": "TYPE_BOOL"}]}


class _Triton(http.server.BaseHTTPRequestHandler):
    config: Any = GOOD

    def _send(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self._send(json.dumps(type(self).config).encode() if self.path.endswith("/config") else b"")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def triton_http() -> Iterator[type[_Triton]]:
    handler = type("Handler", (_Triton,), {})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    handler.port = httpd.server_address[1]  # type: ignore[attr-defined]
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield handler
    httpd.shutdown()


@pytest.mark.parametrize(("config", "field"), [
    ({**GOOD, "max_batch_size": "8"}, "max_batch_size is '8' (str)"),
    ({**GOOD, "max_batch_size": 8.5}, "max_batch_size is 8.5 (float)"),
    ({**GOOD, "max_batch_size": -1}, "max_batch_size is -1 (int)"),
    ({**GOOD, "max_batch_size": True}, "max_batch_size is True (bool)"),
    ({**GOOD, "input": {"name": "text_input"}}, "input is {'name': 'text_input'} (dict)"),
    ({**GOOD, "input": ["text_input"]}, "input[0] is 'text_input' (str)"),
    ({**GOOD, "input": [{"name": 5, "data_type": "TYPE_STRING"}]}, "input[0].name is 5 (int)"),
    ({**GOOD, "input": [{"name": "text_input", "data_type": ["TYPE_STRING"]}]}, "input[0].data_type is ['TYPE_STRING']"),
])
def test_a_model_config_of_the_wrong_types_is_one_error_line(triton_http: type[_Triton], config: Any,
                                                             field: str) -> None:
    """Before: int() or a subscript of the server's JSON raised ValueError/TypeError, a traceback from `trtkv bench`."""
    triton_http.config = config
    url = f"127.0.0.1:{triton_http.port}"  # type: ignore[attr-defined]
    with pytest.raises(TrtkvError) as info:
        check_triton(Endpoint(url, "http", "ensemble"), timeout_s=10.0)
    text = str(info.value)
    assert "\n" not in text and f"the model config from http://{url}, model 'ensemble': {field}" in text, text


def test_a_good_model_config_is_read(triton_http: type[_Triton]) -> None:
    ep = check_triton(Endpoint(f"127.0.0.1:{triton_http.port}", "http", "ensemble"), timeout_s=10.0)  # type: ignore[attr-defined]
    assert ep.max_batch_size == 0 and ep.inputs == {"text_input": "STRING", "max_tokens": "INT32", "stream": "BOOL"}


class _Stream:
    """ModelStreamInfer: one final response whose text_output holds `size` bytes."""

    size = 16

    def __call__(self, requests: Iterator[Any], context: Any) -> Iterator[Any]:
        from tritonclient.grpc import service_pb2

        for request in requests:
            response = service_pb2.ModelInferResponse(model_name=request.model_name, id=request.id)
            response.outputs.add(name="text_output", datatype="BYTES", shape=[1])
            response.raw_output_contents.append(self.size.to_bytes(4, "little") + b"x" * self.size)
            response.parameters["triton_final_response"].bool_param = True
            yield service_pb2.ModelStreamInferResponse(infer_response=response)


@pytest.fixture
def grpc_server() -> Iterator[tuple[_Stream, str]]:
    import grpc
    from tritonclient.grpc import service_pb2_grpc

    fake = _Stream()
    servicer = service_pb2_grpc.GRPCInferenceServiceServicer()
    servicer.ModelStreamInfer = fake  # type: ignore[method-assign]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield fake, f"127.0.0.1:{port}"
    server.stop(grace=0)


def _request(session: GrpcSession) -> RequestRecord:
    rec = RequestRecord("r", "latency", "concurrency=1", 0, 1, 4)
    session.run(rec, "The capital of France", SamplingParams(max_tokens=4), 30.0)
    return rec


def test_a_grpc_answer_over_the_bound_fails_its_request_with_that_reason(grpc_server: tuple[_Stream, str]) -> None:
    """Before: tritonclient's channel takes answers up to 2 GiB, so a 64 MiB + 1 KiB answer was an ok request."""
    fake, url = grpc_server
    session = GrpcSession(Endpoint(url, "grpc", "ensemble", inputs={"text_input": "BYTES"}))
    try:
        fake.size = 16
        assert _request(session).status == OK
        fake.size = GRPC_RESPONSE_BYTES + 1024
        rec = _request(session)
        assert rec.status == ERROR and "a response over the client's 64 MiB bound" in rec.error, rec.error
        assert "\n" not in rec.error and len(rec.error) < 400
        fake.size = 16
        after = _request(session)  # a fresh stream carries the next request
        assert after.status == OK and after.text == "x" * 16, after.error
    finally:
        session.close()
