"""A generated Triton Python model (its own model.py, config.pbtxt and version folder) run in this process, for checks
that cannot afford another tritonserver start.

Real parts: the model.py trtkv generated, its config.pbtxt parsed with Triton's protobuf schema and handed over as the
JSON Triton gives `initialize`, and Triton's own `triton_python_backend_utils.py` (the copy bundled with the
tritonserver trtkv serves: get_input_tensor_by_name, using_decoupled_model_transaction_policy, the response flags).
Stood in: only the classes the Python backend's C++ stub injects into that module (Tensor, InferenceRequest,
InferenceResponse, TritonError, Logger, TritonModelException, the response sender) and the scheduling: `execute` is
called with one list of requests, as the backend calls it. Not covered: tritonserver's HTTP/gRPC front ends, its model
loading, and the stub process boundary (tensors are not serialized)."""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

MODULE = "triton_python_backend_utils"


class TritonModelException(Exception):
    pass


class TritonError:
    CANCELLED = 11  # TRITONSERVER_ERROR_CANCELLED

    def __init__(self, message: str, code: int | None = None) -> None:
        self._message, self._code = message, code

    def message(self) -> str:
        return self._message

    def code(self) -> int | None:
        return self._code


class Tensor:
    def __init__(self, name: str, array: np.ndarray) -> None:
        self._name, self._array = name, np.asarray(array)

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array


class InferenceResponse:
    def __init__(self, output_tensors: list[Tensor] | None = None, error: TritonError | None = None) -> None:
        self._tensors, self._error = list(output_tensors or []), error

    def output_tensors(self) -> list[Tensor]:
        return self._tensors

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def text(self, name: str = "text_output") -> str | None:
        for tensor in self._tensors:
            if tensor.name() == name:
                value = tensor.as_numpy().reshape(-1)[0]
                return value.decode() if isinstance(value, bytes) else str(value)
        return None


class Logger:
    lines: list[str] = []

    @classmethod
    def log_info(cls, message: str) -> None:
        cls.lines.append(message)

    log_warn = log_verbose = log_error = log_info


class ResponseSender:
    """Collects what the model sends; `done` is set by the final flag."""

    def __init__(self, final_flag: int) -> None:
        self.responses: list[tuple[InferenceResponse | None, int]] = []
        self.done = threading.Event()
        self._final = final_flag

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        self.responses.append((response, flags))
        if flags & self._final:
            self.done.set()


class InferenceRequest:
    def __init__(self, inputs: dict[str, np.ndarray], request_id: str = "", final_flag: int = 1) -> None:
        self._inputs = [Tensor(name, array) for name, array in inputs.items()]
        self._id = request_id
        self.sender = ResponseSender(final_flag)

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        return self._id

    def is_cancelled(self) -> bool:
        return False

    def get_response_sender(self) -> ResponseSender:
        return self.sender


def backend_utils() -> ModuleType:
    """Triton's triton_python_backend_utils.py from the bundled tritonserver, with the stub's classes added, installed
    as the module the generated model.py imports."""
    from trtkv.backends.bundled import bundled_triton

    if MODULE in sys.modules and hasattr(sys.modules[MODULE], "InferenceResponse"):
        return sys.modules[MODULE]
    path = bundled_triton() / "backends" / "python" / f"{MODULE}.py"
    spec = importlib.util.spec_from_file_location(MODULE, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for cls in (TritonModelException, TritonError, Tensor, InferenceResponse, InferenceRequest, Logger):
        setattr(module, cls.__name__, cls)
    sys.modules[MODULE] = module
    return module


def model_config_json(config_pbtxt: Path) -> str:
    """config.pbtxt as the JSON Triton passes to initialize() (args["model_config"])."""
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    config = text_format.Parse(config_pbtxt.read_text(), model_config_pb2.ModelConfig())
    return json.dumps(json_format.MessageToDict(config, preserving_proto_field_name=True))


def load_model(model_dir: Path, version: str = "1") -> Any:
    """The model folder's TritonPythonModel, initialized as the Python backend initializes it."""
    backend_utils()
    path = model_dir / version / "model.py"
    spec = importlib.util.spec_from_file_location(f"triton_model_{model_dir.name}", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.TritonPythonModel()
    model.initialize({"model_config": model_config_json(model_dir / "config.pbtxt"), "model_name": model_dir.name,
                      "model_version": version, "model_repository": str(model_dir), "model_instance_kind": "CPU"})
    return model


def request(model: Any, inputs: dict[str, np.ndarray], timeout_s: float = 300.0) -> list[InferenceResponse]:
    """One request through a decoupled model's execute(); every response it sent, the final one last."""
    utils = backend_utils()
    req = InferenceRequest(inputs, final_flag=utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    assert model.execute([req]) is None  # decoupled: responses go through the sender
    assert req.sender.done.wait(timeout_s), f"no final response within {timeout_s} s"
    return [r for r, _ in req.sender.responses if r is not None]
