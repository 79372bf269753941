"""The reference runtime's greedy answers do not depend on its batch, on the real SmolLM2 (FP8 weights, FP8 KV).

The issue: 8 streaming clients against the served smollm2_fp8kv turned "The capital of Egypt is" into " the capital of
the United Arab States." while alone it gave " the capital of the Nile. The Nile": the batched GEMMs summed in
another order. trtkv.runtime.invariant runs every decode token as one row of a fixed (8, D) block and every prefill
token in a fixed slot of a fixed block of its own sequence, so the answers here must be equal token for token
(torch.equal on logits, == on tokens), not close: a decode row alone and among 7 others in another slot, a prompt
prefilled whole and in chunks, and under load (quiz prompts, that prompt, prompts of other lengths, one long enough
to be prefilled in many chunks, requests joining while others decode, a cancelled one) with up to 8 in flight.
Kept to ~1 minute (few prompts, few tokens); benchmarks/batch_invariance_stress.py runs the long stress.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

EGYPT = "The capital of Egypt is"
MAX_TOKENS = 5


def invariance_prompts(quiz: int = 6, long_chars: int = 1200) -> list[str]:
    """The quiz's few-shot prompts, the prompt the issue saw change under load, and prompts of other lengths."""
    from trtkv.core.texts import EVAL_LONG_TEXT, quiz_items, read_texts, resolve_files
    from trtkv.runtime import quiz_patterns

    items = quiz_items()[:quiz]
    long_text = " ".join(read_texts(resolve_files(EVAL_LONG_TEXT)))
    return [EGYPT, *(quiz_patterns.few_shot_prompt(quiz_patterns.render(i["question"])) for i in items),
            "Paris is", "Once upon a time, in a small village by the sea,", long_text[:long_chars]]


def small_prompts() -> list[str]:
    """The test's smaller set: 9 prompts (8 in flight), 2 quiz prompts, the long one cut to ~130 tokens."""
    return [*invariance_prompts(quiz=2, long_chars=600), "1, 2, 3, 4,", "The quick brown fox", "def add(a, b):"]


def smollm2_fp8_runtime(tmp: Path, model_dir: Path | None = None) -> Any:
    """packaged:smollm2 with FP8 weights and an FP8 KV cache (scale 1.0): what smollm2_fp8kv serves."""
    import torch
    from transformers import AutoModelForCausalLM

    from tests.runtime.test_runtime import write_checkpoint, write_engine
    from trtkv.checkpoints.models import resolve_model_dir
    from trtkv.recipe import load_recipe
    from trtkv.runtime import ReferenceRuntime

    folder = model_dir or resolve_model_dir(load_recipe("smollm2_fp8kv"))
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ckpt = write_checkpoint(model, tmp / "ck", weights="fp8", kv="FP8", dtype="bfloat16")
    return ReferenceRuntime.load(write_engine(ckpt, tmp / "engine", model, folder, 4096))


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> dict[str, Any]:
    """The runtime, the prompts' ids and each prompt's solo greedy answer (ReferenceRuntime.generate, one at a time)."""
    rt = smollm2_fp8_runtime(tmp_path_factory.mktemp("inv"), smollm2_dir)
    rt.settings["batch_invariant"] = True  # the opt-in mode (runtime.json batch_invariant / TRTKV_BATCH_INVARIANT=1)
    prompts = [rt.tokenizer(p, add_special_tokens=False)["input_ids"] for p in small_prompts()]
    solo = [rt.generate(p, max_tokens=MAX_TOKENS, end_id=-1) for p in prompts]
    return {"rt": rt, "prompts": prompts, "solo": solo}


def _prefilled(rt: Any, ids: list[int], chunk: int | None) -> Any:
    from trtkv.runtime.batch import make_sequence, prefill_chunk

    seq = make_sequence(rt, ids, max_tokens=MAX_TOKENS, end_id=-1)
    seq.start(rt)
    while not prefill_chunk(rt, seq, chunk):
        pass
    return seq


@pytest.mark.slow
def test_a_decode_row_is_bit_equal_whatever_else_is_in_the_step(setup: dict[str, Any]) -> None:
    import torch

    from trtkv.runtime.batch import decode_step

    rt, prompts = setup["rt"], setup["prompts"]
    alone = decode_step(rt, [_prefilled(rt, prompts[0], None)])[0]
    others = [_prefilled(rt, p, None) for p in prompts[1:9]]
    batch = others[:3] + [_prefilled(rt, prompts[0], None)] + others[3:7]  # 8 rows, ours in slot 3
    assert torch.equal(decode_step(rt, batch)[3], alone)
    pair = [others[7], _prefilled(rt, prompts[0], None)]  # 2 rows, ours in slot 1
    assert torch.equal(decode_step(rt, pair)[1], alone)


@pytest.mark.slow
def test_prefill_chunking_does_not_change_a_bit(setup: dict[str, Any]) -> None:
    import torch

    rt, ids = setup["rt"], setup["prompts"][-4]
    assert len(ids) > 100
    whole, chunked = _prefilled(rt, ids, None), _prefilled(rt, ids, 37)  # 37: block boundaries fall mid-chunk
    assert whole.out == chunked.out
    for a, b in zip(whole.cache.layers, chunked.cache.layers, strict=True):  # the stored codes, byte for byte
        for store_a, store_b in ((a.k_store, b.k_store), (a.v_store, b.v_store)):
            va, vb = store_a.view(), store_b.view()
            assert va.keys() == vb.keys()
            assert all(torch.equal(va[k].view(torch.uint8), vb[k].view(torch.uint8)) for k in va)


@pytest.mark.slow
@pytest.mark.parametrize("concurrency", [8])
def test_greedy_answers_equal_solo_under_load(setup: dict[str, Any], concurrency: int) -> None:
    """Half the requests start at once, the rest join while those decode; one is cancelled after 2 tokens; small
    prefill chunks (max_num_tokens 24) so prompts are prefilled between decode steps."""
    from trtkv.runtime.batch import Batcher, make_sequence

    rt, prompts, solo = setup["rt"], setup["prompts"], setup["solo"]
    n = len(prompts)
    results: dict[int, list[int]] = {}
    errors: list[BaseException] = []
    all_done, first_tokens = threading.Event(), threading.Event()
    lock = threading.Lock()
    cancel = 1  # the first quiz prompt

    def on_done(k: int) -> Any:
        def done(tokens: list[int], error: BaseException | None) -> None:
            with lock:
                results[k] = list(tokens)
                if error is not None:
                    errors.append(error)
                if len(results) == n:
                    all_done.set()
        return done

    def on_token(k: int) -> Any:
        count = [0]

        def token(_t: int) -> bool:
            count[0] += 1
            first_tokens.set()
            return not (k == cancel and count[0] >= 2)
        return token

    batcher = Batcher(rt, max_batch_size=concurrency, max_num_tokens=24)
    try:
        order = [n - 4, *range(n - 4), *range(n - 3, n)]  # the long prompt first: others decode while it is chunked
        for k in order[: n // 2]:
            batcher.submit(make_sequence(rt, prompts[k], max_tokens=MAX_TOKENS, end_id=-1, on_token=on_token(k),
                                         on_done=on_done(k)))
        assert first_tokens.wait(300)
        for k in order[n // 2:]:
            batcher.submit(make_sequence(rt, prompts[k], max_tokens=MAX_TOKENS, end_id=-1, on_token=on_token(k),
                                         on_done=on_done(k)))
        assert all_done.wait(600), f"{n - len(results)} requests never finished"
    finally:
        batcher.shutdown()
    assert not errors
    assert results[cancel] == solo[cancel][:2]
    assert {k: results[k] for k in range(n) if k != cancel} == {k: solo[k] for k in range(n) if k != cancel}
    assert batcher.peak_batch >= 4  # they really ran together (short answers finish before the last ones join)
    egypt = rt.tokenizer.decode(results[0])
    print(f"c{concurrency} (peak batch {batcher.peak_batch}): {EGYPT!r} -> {egypt!r}")
