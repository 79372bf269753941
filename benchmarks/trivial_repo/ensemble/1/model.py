"""Trivial decoupled model: streams `max_tokens` responses of " a" at once, then an empty final response."""

from __future__ import annotations

from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils  # provided by the Triton Python backend

TOKEN = b" a"


def first_int(request: Any, name: str, default: int) -> int:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return int(tensor.as_numpy().reshape(-1)[0]) if tensor is not None else default


class TritonPythonModel:
    """No model at all: the fastest stream the Python backend can send, to measure clients."""

    def initialize(self, args: dict[str, str]) -> None:
        self.one = np.array([[TOKEN]], dtype=np.object_)

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            sender = request.get_response_sender()
            n = max(0, first_int(request, "max_tokens", 16))
            stream = pb_utils.get_input_tensor_by_name(request, "stream")
            streaming = bool(stream.as_numpy().reshape(-1)[0]) if stream is not None else False
            if streaming:
                for _ in range(n):
                    sender.send(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("text_output", self.one)]))
            else:
                whole = np.array([[TOKEN * n]], dtype=np.object_)
                sender.send(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("text_output", whole)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
