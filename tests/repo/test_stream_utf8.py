"""Streaming must not corrupt multi-byte characters (C++ backend path): a stand-in for the C++ `tensorrt_llm` model
streams one token per response, splitting 東京 across tokens as a byte-level BPE does; the real tritonserver runs
trtkv's generated preprocessing, `tensorrt_llm_stream`, postprocessing and ensemble around it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.repo.triton_client import grpc_stream, http_generate_stream
from tests.support import localserver
from trtkv.recipe import load_recipe
from trtkv.recipe.layout import container_artifacts, host_artifacts
from trtkv.repo import generate_repo

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
TEXT = " Tokyo is 東京 🙂 and Paris."

# Stands in for the C++ model: same tensors (the generated config, backend switched to python), one token per
# streamed response, like inflight batching without speculative decoding.
STEP_S = 0.1
FAKE_ENGINE = f'''
import json
import threading
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.tokens = json.loads(json.loads(args["model_config"])["parameters"]["fake_tokens"]["string_value"])

    def execute(self, requests):  # every request in flight at once, as the C++ executor keeps them
        for request in requests:
            threading.Thread(target=self.stream, args=(request, request.get_response_sender()), daemon=True).start()
        return None

    def stream(self, request, sender):
        streaming = pb_utils.get_input_tensor_by_name(request, "streaming")
        stream = streaming is not None and bool(streaming.as_numpy().reshape(-1)[0])
        chunks = [[t] for t in self.tokens] if stream else [self.tokens]
        for chunk in chunks:
            time.sleep({STEP_S})  # one engine step per token
            sender.send(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("output_ids", np.array(chunk, dtype=np.int32).reshape(1, 1, -1)),
                pb_utils.Tensor("sequence_length", np.array([[len(chunk)]], dtype=np.int32))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path):  # noqa: ANN201 - yields a LocalServer
    from tokenizers import Tokenizer

    root = tmp_path_factory.mktemp("utf8")
    tokens = Tokenizer.from_file(str(smollm2_dir / "tokenizer.json")).encode(TEXT, add_special_tokens=False).ids
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRTKV_ENGINES", str(root / "engines"))
        mp.setenv("TRTKV_TRITON_REPO", str(root / "triton_repo"))
        recipe = load_recipe("llama8b_fp8kv", ["build.max_batch_size=4"])
        tokenizer = root / "engines" / recipe.name / "checkpoint" / "tokenizer"
        tokenizer.mkdir(parents=True)
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
            if (smollm2_dir / name).is_file():
                shutil.copyfile(smollm2_dir / name, tokenizer / name)
        repo = generate_repo(recipe, log=lambda _m: None).output
        box, host = container_artifacts(recipe), host_artifacts(recipe)
    served = root / "served"
    shutil.copytree(repo, served)
    for pbtxt in served.rglob("config.pbtxt"):  # a GPU recipe's configs name the container's /models/<recipe>
        pbtxt.write_text(pbtxt.read_text().replace(str(box.root), str(host.root)))
    config = served / "tensorrt_llm" / "config.pbtxt"
    text = config.read_text().replace('backend: "tensorrtllm"', 'backend: "python"')
    config.write_text(text + f'parameters: {{ key: "fake_tokens" value: {{ string_value: "{tokens}" }} }}\n')
    (served / "tensorrt_llm" / "1").mkdir(exist_ok=True)
    (served / "tensorrt_llm" / "1" / "model.py").write_text(FAKE_ENGINE)
    server = localserver.start(served, root / "work", timeout_s=180)
    try:
        yield server, tokens
    finally:
        server.stop()


def test_streamed_parts_are_whole_characters(server, smollm2_dir: Path) -> None:  # noqa: ANN001
    from tokenizers import Tokenizer

    local, tokens = server
    per_token = [Tokenizer.from_file(str(smollm2_dir / "tokenizer.json")).decode([t]) for t in tokens]
    assert sum("\ufffd" in part for part in per_token) >= 2  # the stand-in really splits characters
    result = grpc_stream(local.grpc_url, "Where is Tokyo?", len(tokens))
    assert result.error is None
    assert "".join(result.parts) == TEXT
    assert not any("\ufffd" in part for part in result.parts), result.parts
    assert len(result.parts) >= 5  # still streamed, not one block
    events = http_generate_stream(f"http://{local.http_url}", {"text_input": "Where is Tokyo?", "max_tokens": len(tokens)})
    assert "".join(e["text_output"] for e in events) == TEXT


def test_streams_run_concurrently(server) -> None:  # noqa: ANN001
    """The relay must not serialise requests: the C++ model's in-flight batching needs them all in flight."""
    from concurrent.futures import ThreadPoolExecutor

    local, tokens = server
    alone = grpc_stream(local.grpc_url, "Where is Tokyo?", len(tokens))
    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda _i: grpc_stream(local.grpc_url, "Where is Tokyo?", len(tokens)), range(3)))
    assert [r.error for r in results] == [None] * 3 and all("".join(r.parts) == TEXT for r in results)
    # three at once take about as long as one; in series they would take three times as long
    assert max(r.seconds for r in results) < 2 * alone.seconds, ([r.seconds for r in results], alone.seconds)
