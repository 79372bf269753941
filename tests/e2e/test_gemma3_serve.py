"""Gemma 3 270M (packaged:gemma3) served end to end on the CPU: `trtkv calibrate` + `build` + `repo` + `serve` of
`gemma3_fp8kv` with its 16-bit-KV override (`quantization.kv_cache=none`: the bf16 export), the reference runtime
reading the HF export behind the real bundled tritonserver (ensemble layout), started once for this module.

Its greedy answer to "The capital of France is" must be transformers' own (float32 Gemma3ForCausalLM on the same
folder, the same token ids), and a pass key hidden past the 512-token sliding window must come back through the
bench's needle task (only the 3 full-attention layers can see it there).

The llmapi layout (`build.backend=llmapi` on the same recipe: Triton's TensorRT-LLM `llmapi` model, its LLM() arguments
in model.yaml, trtkv's CPU engine behind the LLM API) is checked on the same calibrated export without a second
tritonserver: its repository is generated and its own model.py is initialized and asked in this process
(tests/support/python_backend.py; what that covers and what not is said there). A real tritonserver serving the
llmapi layout on Gemma 3 is `make bench-gemma3` (benchmarks/bench_gemma3_needles.py --llmapi).

Calibration is cut to 2 x 128 tokens: with kv_cache none ModelOpt quantizes nothing, so the samples only feed the
calibration report's K/V statistics; what this module checks (the export, the runtime reading it, the served tokens)
does not depend on how many there are. The FP8 recipe at its own calibration size and the needles at 8K-32K are
`make bench-gemma3` (benchmarks/bench_gemma3_needles.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.repo.triton_client import grpc_stream, http_generate
from tests.support import python_backend
from trtkv.build.stage import build
from trtkv.calibrate.stage import calibrate
from trtkv.core.process import free_ports
from trtkv.recipe import load_recipe
from trtkv.repo import generate_repo
from trtkv.serving import serve

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
RECIPE = "gemma3_fp8kv"
PROMPT = "The capital of France is"
TOKENS = 8
OVERRIDES = ["quantization.kv_cache=none", "calibration.num_samples=2", "calibration.seq_len=128",
             "calibration.batch_size=2", "bench.concurrency=[1]", "bench.needle_context_lengths=[1024]",
             "probe.needle_depths=[0.25]", "bench.thresholds=[]"]


def _transformers_greedy(folder: Path, prompt: str, tokens: int) -> tuple[list[int], str]:
    """transformers' greedy continuation (float32) on `folder`, with the folder's tokenizer (BOS added)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    ids = tokenizer(prompt)["input_ids"]
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), max_new_tokens=tokens, do_sample=False)
    new = out[0, len(ids):].tolist()
    return new, str(tokenizer.decode(new, skip_special_tokens=True))


@pytest.fixture(scope="module")
def gemma3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, serve.ServerRecord, str]]:
    """The chain into temp folders, the server on free ports; transformers' answer computed before the server
    starts (no CPU contention); always stopped."""
    tmp = tmp_path_factory.mktemp("gemma3")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRTKV_ENGINES", str(tmp / "engines"))
        mp.setenv("TRTKV_TRITON_REPO", str(tmp / "triton_repo"))
        http, grpc, metrics = free_ports(3)
        recipe = load_recipe(RECIPE, [*OVERRIDES, f"triton.http_port={http}", f"triton.grpc_port={grpc}",
                                      f"triton.metrics_port={metrics}"])
        calibrate(recipe, log=print)
        build(recipe, log=print)
        generate_repo(recipe, log=print)
        from trtkv.recipe.layout import checkpoint_dir

        _, want = _transformers_greedy(checkpoint_dir(recipe) / "hf", PROMPT, TOKENS)
        try:
            info = serve.start(recipe, timeout_s=900)
            assert info is not None
            print(f"\ngemma3 tritonserver ready in {info.ready_seconds} s")
            yield recipe, info, want
        finally:
            serve.stop(recipe, timeout_s=30)


def test_served_greedy_tokens_equal_transformers(gemma3_server: tuple[Any, serve.ServerRecord, str]) -> None:
    _, info, want = gemma3_server
    assert want.startswith(" the capital of"), want  # the right token ids (a char-level tokenizer gives " 1 1 1")
    streamed = grpc_stream(f"{info.host}:{info.grpc_port}", PROMPT, TOKENS, timeout_s=300)
    assert streamed.error is None and streamed.text == want, streamed
    status, body = http_generate(info.http_url, {"text_input": PROMPT, "max_tokens": TOKENS, "bad_words": "",
                                                 "stop_words": ""}, timeout_s=300)
    assert status == 200 and body["text_output"] == want, body


def test_needle_past_the_sliding_window_is_found(gemma3_server: tuple[Any, serve.ServerRecord, str],
                                                 tmp_path: Path) -> None:
    from trtkv.bench.runner import BenchOptions, run_bench
    from trtkv.cli.bench import served_side

    recipe, _, _ = gemma3_server
    outcome = run_bench(recipe, BenchOptions(tasks=["needle"], latency=False, output=tmp_path, progress=False), served_side())
    needle = outcome.results["accuracy"]["needle"]
    items = needle["items"]
    print(f"gemma3 needle @1024: {[(i['input_tokens'], i['output']) for i in items]}")
    assert needle["failed"] == 0 and needle["total"] == 1
    assert items[0]["input_tokens"] > 512 + 256  # the pass key (depth 0.25) lies outside every sliding window
    assert needle["correct"] == 1, items


def test_llmapi_layout_model_answers_in_process(gemma3_server: tuple[Any, serve.ServerRecord, str], tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The llmapi layout of the same recipe on the module's calibrated export (linked, read only): model.yaml carries
    the HF export, the recipe's limits and TensorRT-LLM's per-layer windows; the export's tokenizer.json is the converted
    folder's byte for byte; the repository's own model.py (run by trtkv.runtime.llm.LLM) streams and answers
    transformers' greedy tokens."""
    import hashlib

    import numpy as np
    import yaml

    from trtkv.checkpoints.models import local_model_dir
    from trtkv.recipe.layout import checkpoint_dir

    recipe, _, want = gemma3_server
    ckpt = checkpoint_dir(recipe)
    monkeypatch.setenv("TRTKV_ENGINES", str(tmp_path / "engines"))
    monkeypatch.setenv("TRTKV_TRITON_REPO", str(tmp_path / "triton_repo"))
    (tmp_path / "engines" / RECIPE).mkdir(parents=True)
    (tmp_path / "engines" / RECIPE / "checkpoint").symlink_to(ckpt)
    llm_recipe = load_recipe(RECIPE, [*OVERRIDES, "build.backend=llmapi"])
    repo = generate_repo(llm_recipe, log=print).output  # no build: the llmapi build validates this very export, as
    model_dir = repo / "tensorrt_llm"                   # the reference build above did, and decodes one smoke token
    args = yaml.safe_load((model_dir / "1" / "model.yaml").read_text())
    assert Path(args["model"]).resolve() == (ckpt / "hf").resolve()
    assert (args["max_seq_len"], args["max_input_len"], args["max_num_tokens"], args["enable_chunked_prefill"]) == (
        32768, 32760, 2048, True)
    assert args["kv_cache_config"]["dtype"] == "auto"  # kv_cache none: the bf16 export's 16-bit baseline
    assert args["kv_cache_config"]["max_attention_window"] == [512] * 5 + [32768]
    converted = local_model_dir(recipe)
    assert converted is not None
    digest = [hashlib.sha256((d / "tokenizer.json").read_bytes()).hexdigest() for d in (converted, ckpt / "hf")]
    assert digest[0] == digest[1], f"{ckpt / 'hf' / 'tokenizer.json'} is not {converted / 'tokenizer.json'}"

    model = python_backend.load_model(model_dir)
    try:
        assert type(model.llm).__module__ == "trtkv.runtime.llm" and model.decoupled
        assert model.llm.runtime.kv_format == "none" and model.llm.runtime.prefill_chunk == 2048
        assert not any("max_attention_window" in a for a in model.llm.ignored_args)
        inputs = {"text_input": np.array([PROMPT.encode()], dtype=object),
                  "sampling_param_max_tokens": np.array([TOKENS], dtype=np.int32),
                  "sampling_param_temperature": np.array([0.0], dtype=np.float32),
                  "return_finish_reason": np.array([True])}
        streamed = python_backend.request(model, {**inputs, "streaming": np.array([True])})
        assert not any(r.has_error() for r in streamed), [r.error().message() for r in streamed if r.has_error()]
        texts = [r.text() for r in streamed]
        assert len(texts) >= 2 and all(str(b).startswith(str(a)) for a, b in zip(texts, texts[1:], strict=False))
        assert texts[-1] == want, texts
        whole = python_backend.request(model, inputs)
        assert len(whole) == 1 and not whole[0].has_error()
        assert (whole[0].text(), whole[0].text("finish_reason")) == (want, "length")
    finally:
        model.finalize()
