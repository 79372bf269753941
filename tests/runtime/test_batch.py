"""In-flight batching in the reference runtime (trtkv.runtime.batch): the batched decode step computes what the
model's own forward computes, greedy tokens in a batch equal solo runs, requests join and leave at every step, a
cancelled request frees its slot at once, long prompts are prefilled in chunks between decode steps, and one failing
request does not fail the others."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import torch

from tests.runtime.test_runtime import has_quantized_cache, tiny_llama, write_checkpoint, write_engine  # noqa: E402
from trtkv.runtime import ReferenceRuntime
from trtkv.runtime.batch import Batcher, decode_step, make_sequence, prefill_chunk

PROMPTS = [[1, 2, 3], [9, 8], [50, 60, 70, 80], [4], [11, 12, 13, 14, 15], [100, 7], [33], [42, 43, 44]]


@pytest.fixture(autouse=True)
def _single_thread(one_torch_thread: None) -> None:
    """Tiny models run fastest single-threaded (shared fixture in tests/conftest.py)."""


@pytest.fixture(scope="module")
def runtimes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ReferenceRuntime]:
    """The tiny Llama with an unquantized and with a static-scale FP8 KV cache."""
    root = tmp_path_factory.mktemp("batch")
    model = tiny_llama()
    plain = ReferenceRuntime.load(write_engine(write_checkpoint(model, root / "c0"), root / "e0", model))
    out = {"none": plain}
    if has_quantized_cache():
        ckpt = write_checkpoint(model, root / "c1", kv="FP8", kv_factor=0.05)
        out["fp8"] = ReferenceRuntime.load(write_engine(ckpt, root / "e1", model))
    return out


class Collector:
    """on_done callbacks that record each request's tokens and error, and wait for all of them."""

    def __init__(self, n: int) -> None:
        self.results: dict[int, tuple[list[int], BaseException | None]] = {}
        self.left, self.done = n, threading.Event()
        self.lock = threading.Lock()

    def __call__(self, k: int) -> Any:
        def on_done(tokens: list[int], error: BaseException | None) -> None:
            with self.lock:
                self.results[k] = (list(tokens), error)
                self.left -= 1
                if self.left == 0:
                    self.done.set()
        return on_done

    def wait(self) -> dict[int, tuple[list[int], BaseException | None]]:
        assert self.done.wait(120), f"requests never finished: {self.left} left"
        return self.results


def test_batched_step_is_the_models_forward(runtimes: dict[str, ReferenceRuntime]) -> None:
    rt = runtimes["none"]
    seq = make_sequence(rt, PROMPTS[2], max_tokens=4)
    seq.start(rt)
    assert prefill_chunk(rt, seq, None)
    cache = rt.new_cache()
    with torch.inference_mode():
        rt.model(input_ids=torch.tensor([PROMPTS[2]]), past_key_values=cache, use_cache=True)
        want = rt.model(input_ids=torch.tensor([[seq.last]]), past_key_values=cache, use_cache=True).logits[0, -1]
    got = decode_step(rt, [seq])[0]
    # the same modules and ops in the same order: float32 agrees to its own rounding (a few ulps of the logits)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kv", ["none", "fp8"])
@pytest.mark.parametrize("batch", [8, 3])
def test_batched_greedy_equals_solo(runtimes: dict[str, ReferenceRuntime], kv: str, batch: int) -> None:
    if kv not in runtimes:
        pytest.skip("no quantized cache")
    rt = runtimes[kv]
    solo = [rt.generate(p, max_tokens=12 + i) for i, p in enumerate(PROMPTS)]  # different lengths: they leave apart
    batcher, got = Batcher(rt, max_batch_size=batch), Collector(len(PROMPTS))
    streamed: dict[int, list[int]] = {i: [] for i in range(len(PROMPTS))}
    try:
        for i, p in enumerate(PROMPTS):
            batcher.submit(make_sequence(rt, p, max_tokens=12 + i, on_token=streamed[i].append, on_done=got(i)))
        results = got.wait()
    finally:
        batcher.shutdown()
    assert [results[i][0] for i in range(len(PROMPTS))] == solo
    assert [streamed[i] for i in range(len(PROMPTS))] == solo
    assert all(results[i][1] is None for i in results)
    assert batcher.peak_batch == min(batch, len(PROMPTS))  # they really ran together


def test_cancel_frees_the_slot_at_once(runtimes: dict[str, ReferenceRuntime]) -> None:
    rt = runtimes["none"]
    batcher, got = Batcher(rt, max_batch_size=1), Collector(2)
    first_of_b: list[float] = []
    stop = threading.Event()
    try:
        def slow_client(_token: int) -> bool:  # a stream that would last ~2 s
            time.sleep(0.01)
            return not stop.is_set()

        a = make_sequence(rt, [1, 2, 3], max_tokens=200, end_id=-1, on_token=slow_client, on_done=got(0))
        b = make_sequence(rt, [4, 5], max_tokens=3, end_id=-1,
                          on_token=lambda _t: first_of_b.append(time.monotonic()) or None, on_done=got(1))
        batcher.submit(a)
        batcher.submit(b)  # waits: the only slot is A's
        time.sleep(0.2)
        assert not first_of_b
        stop.set()  # the client goes away
        cancelled_at = time.monotonic()
        results = got.wait()
    finally:
        batcher.shutdown()
    assert 0 < len(results[0][0]) < 200
    assert len(results[1][0]) == 3 and first_of_b[0] - cancelled_at < 5.0


def test_long_prompt_is_prefilled_in_chunks_while_others_decode(runtimes: dict[str, ReferenceRuntime]) -> None:
    rt = runtimes["none"]
    batcher, got = Batcher(rt, max_batch_size=2, max_num_tokens=8), Collector(2)
    events: list[str] = []
    long_prompt = list(range(1, 100))
    solo = rt.generate(long_prompt, max_tokens=4, end_id=-1)
    try:
        batcher.submit(make_sequence(rt, [7, 8], max_tokens=40, end_id=-1, on_token=lambda _t: events.append("a"),
                                     on_done=got(0)))
        while not events:
            time.sleep(0.01)
        batcher.submit(make_sequence(rt, long_prompt, max_tokens=4, end_id=-1,
                                     on_token=lambda _t: events.append("b"), on_done=got(1)))
        results = got.wait()
    finally:
        batcher.shutdown()
    first_b = events.index("b")
    # 99 prompt tokens at <= 7 per step (8 minus the decoding sequence's token): A streams during B's 15 chunks
    assert events[:first_b].count("a") >= 14
    assert results[1][0] == solo  # chunked prefill gives the same tokens


def test_one_failing_request_does_not_fail_the_batch(runtimes: dict[str, ReferenceRuntime]) -> None:
    rt = runtimes["none"]
    batcher, got = Batcher(rt, max_batch_size=4), Collector(3)

    def boom(_token: int) -> bool:
        raise RuntimeError("client callback failed")

    try:
        batcher.submit(make_sequence(rt, PROMPTS[0], max_tokens=8, end_id=-1, on_done=got(0)))
        batcher.submit(make_sequence(rt, PROMPTS[1], max_tokens=8, end_id=-1, on_token=boom, on_done=got(1)))
        batcher.submit(make_sequence(rt, PROMPTS[2], max_tokens=8, end_id=-1, on_done=got(2)))
        results = got.wait()
    finally:
        batcher.shutdown()
    assert isinstance(results[1][1], RuntimeError)
    assert results[0] == (rt.generate(PROMPTS[0], max_tokens=8, end_id=-1), None)
    assert results[2] == (rt.generate(PROMPTS[2], max_tokens=8, end_id=-1), None)
