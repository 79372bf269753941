"""The soak's streaming client (benchmarks/soak.py `one_request`) against an in-process gRPC server speaking Triton's
own service definition (tritonclient's protobufs): a request whose server dies before its first part ends with that
error at once, whatever its kind (a "cancel" request used to wait out the whole request timeout), and one that gets
nothing is cancelled by the client at its timeout and counted lost (closing the stream used to wait for the server).
The real server (a killed stub under load) is the soak test in tests/e2e/test_serve.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import pytest

from benchmarks.soak import one_request


class Server:
    """ModelStreamInfer per `mode`: answer (three parts, then the final response), die (abort UNAVAILABLE 0.3 s after
    the request, before any part) or silent (hold the stream open without a word)."""

    def __init__(self) -> None:
        self.mode = "answer"
        self.ended = threading.Event()  # the server saw its stream end (the client cancelled or went away)

    def stream(self, requests: Iterator[Any], context: Any) -> Iterator[Any]:
        import grpc
        import numpy as np
        from tritonclient.grpc import service_pb2
        from tritonclient.utils import serialize_byte_tensor

        request = next(requests)
        context.add_callback(self.ended.set)
        if self.mode == "die":
            time.sleep(0.3)
            context.abort(grpc.StatusCode.UNAVAILABLE, "Socket closed")
        if self.mode == "silent":
            self.ended.wait(15.0)
            return
        for i, word in enumerate([" Paris", ",", " France"]):
            response = service_pb2.ModelInferResponse(model_name=request.model_name, id=request.id)
            response.outputs.add(name="text_output", datatype="BYTES", shape=[1, 1])
            response.raw_output_contents.append(serialize_byte_tensor(np.array([word.encode()], dtype=object)).item())
            response.parameters["triton_final_response"].bool_param = i == 2
            yield service_pb2.ModelStreamInferResponse(infer_response=response)
            time.sleep(0.2)


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[Server, str]]:
    import grpc
    from tritonclient.grpc import service_pb2_grpc

    from trtkv.core.process import free_ports

    fake = Server()
    servicer = service_pb2_grpc.GRPCInferenceServiceServicer()
    servicer.ModelStreamInfer = fake.stream  # type: ignore[method-assign]
    grpc_server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, grpc_server)
    (port,) = free_ports(1)
    grpc_server.add_insecure_port(f"127.0.0.1:{port}")
    grpc_server.start()
    yield fake, f"127.0.0.1:{port}"
    grpc_server.stop(grace=0)


def test_answers_and_cancels_end_as_before(server: tuple[Server, str]) -> None:
    fake, url = server
    fake.mode = "answer"
    answered = one_request(url, "normal", 0, 10.0, time.monotonic())
    assert (answered.text, answered.final, answered.error) == (" Paris, France", True, None)
    fake.ended.clear()
    cancelled = one_request(url, "cancel", 0, 10.0, time.monotonic())
    assert (cancelled.final, cancelled.error) == (True, None) and cancelled.text.startswith(" Paris")
    assert fake.ended.wait(5.0)  # the server saw the stream cancelled


@pytest.mark.parametrize("kind", ["normal", "cancel", "malformed"])
def test_a_server_dying_before_the_first_part_is_an_error_at_once(server: tuple[Server, str], kind: str) -> None:
    fake, url = server
    fake.mode = "die"
    start = time.monotonic()
    out = one_request(url, kind, 1, 30.0, start)
    assert out.error and "Socket closed" in out.error and not out.final
    assert out.end - out.start < 5.0, f"a {kind} request waited {out.end - out.start:.1f} s for an error it had"


def test_silence_is_lost_at_the_timeout_and_cancelled_by_the_client(server: tuple[Server, str]) -> None:
    fake, url = server
    fake.mode = "silent"
    fake.ended.clear()
    start = time.monotonic()
    out = one_request(url, "normal", 2, 1.0, start)
    assert (out.final, out.error, out.text) == (False, None, "")  # lost: neither an answer nor an error
    assert out.end - out.start < 4.0, f"returned {out.end - out.start:.1f} s after a 1 s timeout"
    assert fake.ended.wait(5.0)  # the client cancelled it: the server's stream ended
