"""packaged:gemma3 (Gemma 3 270M, bf16) on the reference runtime: greedy tokens with a 16-bit KV cache equal
transformers' float32 Gemma3ForCausalLM, solo and in the in-flight batch; FP8 KV runs and its tokens are printed."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

from trtkv.runtime import Batcher, ReferenceRuntime, make_sequence

pytestmark = pytest.mark.slow  # 270M parameters, a 262K vocabulary: ~30 s to load, ~0.8 s a token on 2 shared cores
PROMPTS = ["The capital of France is", "Water boils at a temperature of"]
TOKENS = 6


@pytest.fixture(scope="module")
def gemma3() -> tuple[Any, ReferenceRuntime]:
    from transformers import AutoModelForCausalLM

    from trtkv.checkpoints.models import packaged_model

    folder = packaged_model("gemma3")
    reference = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    return reference, ReferenceRuntime.load_hf(folder)


@pytest.mark.e2e  # runs the real model: not in `make check`
def test_bf16_kv_greedy_equals_transformers_solo_and_batched(gemma3: tuple[Any, ReferenceRuntime]) -> None:
    reference, runtime = gemma3
    rt = runtime.with_kv_format("bf16")
    assert runtime.kv_format == "none" and rt.tokenizer is not None  # an unquantized export: no KV scales
    prompts = [rt.tokenizer(p)["input_ids"] for p in PROMPTS]
    want = []
    for ids in prompts:
        with torch.inference_mode():
            out = reference.generate(torch.tensor([ids]), max_new_tokens=TOKENS, do_sample=False)
        want.append(out[0, len(ids):].tolist())
    assert rt.tokenizer.decode(want[0]) == " the capital of the country of"
    assert [rt.generate(ids, max_tokens=TOKENS) for ids in prompts] == want
    results: dict[int, list[int]] = {}
    done = threading.Event()
    batcher = Batcher(rt, max_batch_size=2)
    try:
        for i, ids in enumerate(prompts):
            def on_done(tokens: list[int], error: BaseException | None, i: int = i) -> None:
                results[i] = tokens if error is None else [-1]
                if len(results) == len(prompts):
                    done.set()
            batcher.submit(make_sequence(rt, ids, max_tokens=TOKENS, on_done=on_done))
        assert done.wait(300)
    finally:
        batcher.shutdown()
    assert [results[i] for i in range(len(prompts))] == want and batcher.peak_batch == 2


def test_fp8_kv_runs_and_reports_its_tokens(gemma3: tuple[Any, ReferenceRuntime]) -> None:
    _, runtime = gemma3
    rt = runtime.with_kv_format("fp8_scale1")  # TensorRT-LLM's FP8 KV on an HF export: scale 1.0
    ids = rt.tokenizer(PROMPTS[0])["input_ids"]
    tokens = rt.generate(ids, max_tokens=TOKENS)
    print(f"gemma3 fp8_scale1 KV: {tokens} {rt.tokenizer.decode(tokens)!r}")
    assert len(tokens) == TOKENS
