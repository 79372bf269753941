"""The LLM API path end to end on the CPU: `trtkv build` (backend llmapi) on the session's HF export, the repository
in upstream's llmapi layout, the real tritonserver running the very model.py a GPU user deploys (with trtkv's CPU
engine behind the LLM API interface), HTTP and gRPC requests with upstream's tensors, cancellation, `trtkv bench`,
`trtkv status` and `trtkv generate`."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import CHAIN_OVERRIDES
from tests.repo.triton_client import http_generate, http_generate_stream
from trtkv.build.stage import build
from trtkv.core.process import free_ports
from trtkv.recipe import load_recipe
from trtkv.repo import generate_repo
from trtkv.serving import health, serve

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
RECIPE = "smollm2_fp8kv_llmapi"
PROMPT = "The capital of France is"
MODEL = "tensorrt_llm"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, smollm2_engine: Path) -> Iterator[tuple[Any, serve.ServerRecord]]:
    """build + repo + serve of the llmapi recipe on the chain's calibrated checkpoint (linked, read only)."""
    tmp = tmp_path_factory.mktemp("llmapi")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRTKV_ENGINES", str(tmp / "engines"))
        mp.setenv("TRTKV_TRITON_REPO", str(tmp / "triton_repo"))
        (tmp / "engines" / RECIPE).mkdir(parents=True)
        (tmp / "engines" / RECIPE / "checkpoint").symlink_to(smollm2_engine / "checkpoint")
        http, grpc, metrics = free_ports(3)
        recipe = load_recipe(RECIPE, [*CHAIN_OVERRIDES, f"triton.http_port={http}", f"triton.grpc_port={grpc}",
                                      f"triton.metrics_port={metrics}"])
        build(recipe, log=print)
        generate_repo(recipe, log=print)
        try:
            info = serve.start(recipe, timeout_s=600)
            assert info is not None
            yield recipe, info
        finally:
            serve.stop(recipe, timeout_s=30)


def _grpc(info: serve.ServerRecord, inputs: dict[str, Any], request_id: str = "", timeout_s: float = 120.0,
          on_start: Any = None, first_text: threading.Event | None = None) -> tuple[list[str], str | None]:
    """One streaming gRPC request with llmapi tensors: (every text_output, error); `first_text` is set when the first
    text arrives."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import np_to_triton_dtype

    texts: list[str] = []
    errors: list[str] = []
    done = threading.Event()

    def callback(result: Any, error: Any) -> None:  # tritonclient passes keywords
        if error is not None:
            errors.append(str(error))
            done.set()
            return
        text = result.as_numpy("text_output")
        if text is not None and text.size:
            texts.append(text.reshape(-1)[0].decode())
            if first_text is not None:
                first_text.set()
        final = result.get_response().parameters.get("triton_final_response")
        if final is not None and final.bool_param:
            done.set()

    client = grpcclient.InferenceServerClient(f"{info.host}:{info.grpc_port}")
    client.start_stream(callback=callback)
    try:
        tensors = []
        for name, array in inputs.items():
            tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            tensor.set_data_from_numpy(array)
            tensors.append(tensor)
        client.async_stream_infer(MODEL, tensors, request_id=request_id, enable_empty_final_response=True)
        if on_start is not None:
            on_start()
        assert done.wait(timeout_s), f"no final response within {timeout_s} s"
    finally:
        client.stop_stream()
        client.close()
    return texts, (errors[0] if errors else None)


def _prompt(text: str, max_tokens: int, streaming: bool = True) -> dict[str, Any]:
    return {"text_input": np.array([text.encode()], dtype=object),
            "sampling_param_max_tokens": np.array([max_tokens], dtype=np.int32),
            "sampling_param_temperature": np.array([0.0], dtype=np.float32),
            "streaming": np.array([streaming], dtype=bool)}


def test_generate_answers_with_upstream_tensors(server: tuple[Any, serve.ServerRecord]) -> None:
    _, info = server
    status, body = http_generate(info.http_url, {"text_input": PROMPT, "sampling_param_max_tokens": 8,
                                                 "sampling_param_temperature": 0, "return_finish_reason": True},
                                 model=MODEL)
    assert status == 200, body
    assert body["text_output"].startswith(" Paris") and body["finish_reason"] == "length"
    status, body = http_generate(info.http_url, {"text_input": PROMPT, "sampling_param_max_tokens": 8,
                                                 "sampling_param_temperature": 0, "sampling_param_stop": ["."],
                                                 "return_stop_reason": True, "return_finish_reason": True},
                                 model=MODEL)
    assert (body["text_output"], body["finish_reason"], body["stop_reason"]) == (" Paris", "stop", ".")


def test_generate_stream_sends_the_text_so_far(server: tuple[Any, serve.ServerRecord]) -> None:
    _, info = server
    body = {"text_input": PROMPT, "sampling_param_max_tokens": 8, "sampling_param_temperature": 0}
    events = http_generate_stream(info.http_url, body, model=MODEL, stream_key="streaming")
    texts = [e["text_output"] for e in events]
    assert len(texts) >= 4 and not any("error" in e for e in events)
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:], strict=False))
    _, whole = http_generate(info.http_url, body, model=MODEL)
    assert texts[-1] == whole["text_output"]
    grpc_texts, error = _grpc(info, _prompt(PROMPT, 8))
    assert error is None and grpc_texts[-1] == whole["text_output"]


@pytest.mark.parametrize("extra, message", [
    ({"image_url": ["http://x/cat.png"]}, "image_url is not supported"),
    ({"lora_id": 3}, "lora_id is not supported"),
    ({"sampling_param_best_of": 2}, "one sequence per request"),
])
def test_unsupported_inputs_are_refused_per_request(server: tuple[Any, serve.ServerRecord], extra: dict[str, Any],
                                                    message: str) -> None:
    _, info = server
    status, body = http_generate(info.http_url, {"text_input": PROMPT, "sampling_param_max_tokens": 2, **extra},
                                 model=MODEL)
    assert status == 400 and message in body.get("error", ""), body
    status, body = http_generate(info.http_url, {"text_input": PROMPT, "sampling_param_max_tokens": 2}, model=MODEL)
    assert status == 200 and body["text_output"]


def test_stop_cancels_the_requests_with_that_id(server: tuple[Any, serve.ServerRecord]) -> None:
    _, info = server
    streaming = threading.Event()

    def cancel() -> None:  # once the first text has streamed (not after a fixed second: issue 58)
        assert streaming.wait(120)
        _grpc(info, {"text_input": np.array([b""], dtype=object), "stop": np.array([True])}, request_id="long-1")

    canceller = threading.Thread(target=cancel)
    texts, error = _grpc(info, _prompt("Once upon a time", 400), request_id="long-1",
                         on_start=canceller.start, first_text=streaming)
    canceller.join()
    assert error is not None and "cancelled" in error and texts  # streamed some text, then the cancellation
    assert len(texts) < 400  # cut short, on any CPU (was: a wall-clock bound from this CPU's ~15 tokens/s)
    status, body = http_generate(info.http_url, {"text_input": PROMPT, "sampling_param_max_tokens": 2}, model=MODEL)
    assert status == 200 and body["text_output"]  # the model serves on


def test_bench_measures_the_llmapi_model(server: tuple[Any, serve.ServerRecord], tmp_path: Path) -> None:
    from trtkv.bench.runner import BenchOptions, run_bench
    from trtkv.cli.bench import served_side

    recipe, _ = server
    outcome = run_bench(recipe, BenchOptions(tasks=["quiz"], output=tmp_path, progress=False), served_side())
    results = outcome.results
    assert outcome.exit_code == 0 and results["endpoint"]["model"] == MODEL
    level = results["levels"]["concurrency=1"]
    assert level["request_count"]["failed"] == 0 and level["output_sequence_length"]["avg"] > 1
    assert results["accuracy"]["quiz"]["failed"] == 0 and results["accuracy"]["quiz"]["total"] == 3


def test_status_and_generate(server: tuple[Any, serve.ServerRecord]) -> None:
    from trtkv.serving.generate import generate

    recipe, _ = server
    state = health.check(recipe, canaries=1)
    assert state.state == "healthy", state.checks
    assert generate(recipe, PROMPT, 4).startswith(" Paris")
    import subprocess

    from trtkv.contracts.canary import canary_script, health_cmd
    from trtkv.contracts.interface import LLMAPI

    check = subprocess.run(["sh", "-c", health_cmd(canary_script(recipe.triton.http_port, LLMAPI))],
                           capture_output=True, timeout=120)
    assert check.returncode == 0, check.stderr  # the container health check, on the llmapi model
