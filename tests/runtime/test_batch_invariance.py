"""The reference runtime's greedy answers do not depend on its batch, on the real SmolLM2 (FP8 weights, FP8 KV).

The issue: 8 streaming clients against the served smollm2_fp8kv turned "The capital of Egypt is" into " the capital of
the United Arab States." while alone it gave " the capital of the Nile. The Nile": the batched GEMMs summed in
another order. trtkv.runtime.invariant runs every decode token as one row of a fixed (8, D) block and every prefill
token in a fixed slot of a fixed block of its own sequence, so the answers here must be equal token for token
(torch.equal on logits, == on tokens), not close: a decode row alone and among 7 others in another slot, a prompt
prefilled whole and in chunks, and under load (quiz prompts, that prompt, prompts of other lengths, one long enough
to be prefilled in many chunks, requests joining while others decode, a cancelled one) with up to 8 in flight.
Kept small (few prompts, few tokens, 4 in flight); `benchmarks/batch_invariance_stress.py` runs the long stress (8
clients, random prompts, cancellations, `--max-num-tokens 24` for chunked prefill between decode steps).
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
    """The runtime in its batch-invariant mode and the prompts' ids."""
    rt = smollm2_fp8_runtime(tmp_path_factory.mktemp("inv"), smollm2_dir)
    rt.settings["batch_invariant"] = True  # the default (runtime.json batch_invariant false / TRTKV_BATCH_INVARIANT=0: off)
    prompts = [rt.tokenizer(p, add_special_tokens=False)["input_ids"] for p in small_prompts()]
    return {"rt": rt, "prompts": prompts}


def test_batch_invariance_is_the_default_and_the_environment_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    from trtkv.runtime import ReferenceRuntime

    def runtime(settings: dict[str, Any]) -> Any:
        return ReferenceRuntime(model=None, config=None, tokenizer=None, kv_format="none", kv_scales=None,
                                max_seq_len=8, eos_token_ids=[], bos_token_id=None, engine_dir=Path("."),
                                settings=settings)

    monkeypatch.delenv("TRTKV_BATCH_INVARIANT", raising=False)
    assert runtime({}).batch_invariant and not runtime({"batch_invariant": False}).batch_invariant
    monkeypatch.setenv("TRTKV_BATCH_INVARIANT", "0")
    assert not runtime({"batch_invariant": True}).batch_invariant
    monkeypatch.setenv("TRTKV_BATCH_INVARIANT", "1")
    assert runtime({"batch_invariant": False}).batch_invariant


def _reference_attention(q: Any, keys: Any, values: Any, positions: Any, window: int | None) -> Any:
    """Plain softmax attention per row (float64), to check attend_tiles computes attention at all."""
    import torch

    heads, kv_heads = q.shape[1], keys.shape[0]
    out = []
    for r, p in enumerate(positions.tolist()):
        lo = 0 if window is None else max(0, p - window + 1)
        k = keys[:, lo: p + 1].double().repeat_interleave(heads // kv_heads, 0)
        v = values[:, lo: p + 1].double().repeat_interleave(heads // kv_heads, 0)
        probs = torch.softmax((k @ q[r].double()[:, :, None])[..., 0] * 0.125, dim=-1)
        out.append((probs[:, None, :] @ v)[:, 0].reshape(-1))
    return torch.stack(out)


def _in_chunks(q: Any, size: int, attend: Any) -> Any:
    """Every row of q (n, H, d) attended in prefill chunks of `size`, each padded to whole invariant.ROWS spans as
    prefill pads them: attend(rows, base, top, start, end) gives the span's rows base..top-1."""
    import torch

    from trtkv.runtime import invariant

    n, heads, d = q.shape
    rows = []
    for start in range(0, n, size):
        end = min(n, start + size)
        base, top = start - start % invariant.ROWS, -(-end // invariant.ROWS) * invariant.ROWS
        qs = torch.zeros(top - base, heads, d)
        qs[start - base: end - base] = q[start:end]
        rows.append(attend(qs, base, top, start, end)[start - base: end - base])
    return torch.cat(rows)


@pytest.mark.parametrize(("window", "query_block"), [(None, 512), (40, 512), (None, 32), (40, 32)])
def test_prefill_attention_rows_do_not_depend_on_the_chunk(window: int | None, query_block: int,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """attend_tiles on one 150-token sequence, whole and in chunks of 37 and 5 (tile and panel boundaries fall
    mid-chunk; a sliding layer sees only its window; 32-row query blocks read fewer tiles than the whole): every row
    bit-equal, and equal to softmax attention."""
    import torch

    from trtkv.runtime import key_tiles

    monkeypatch.setattr(key_tiles, "QUERY_BLOCK", query_block)

    gen = torch.Generator().manual_seed(1)
    n, heads, kv_heads, d = 150, 6, 2, 64
    q = torch.randn(n, heads, d, generator=gen)
    keys, values = torch.randn(kv_heads, n, d, generator=gen), torch.randn(kv_heads, n, d, generator=gen)

    def tiles(qs: Any, base: int, top: int, start: int, end: int) -> Any:
        first = 0 if window is None else max(0, start - window + 1)  # what a sliding cache still holds
        return key_tiles.attend_tiles(0.125, qs, torch.arange(base, top), keys[:, first:end], values[:, first:end],
                                       first, window)

    def chunked(size: int) -> Any:
        return _in_chunks(q, size, tiles)

    whole = chunked(n)
    assert torch.equal(chunked(37), whole) and torch.equal(chunked(5), whole)
    torch.testing.assert_close(whole.double(), _reference_attention(q, keys, values, torch.arange(n), window),
                               atol=1e-5, rtol=1e-4)


def test_flash_prefill_attention_rows_do_not_depend_on_the_chunk() -> None:
    """trtkv.runtime.flash on one 600-token sequence (two 512-key spans), whole and in chunks of 37 and 5: every row
    bit-equal, and equal to softmax attention."""
    import torch

    from trtkv.runtime import flash

    gen = torch.Generator().manual_seed(2)
    n, heads, kv_heads, d = 600, 6, 2, 64
    q = torch.randn(n, heads, d, generator=gen)
    keys, values = torch.randn(kv_heads, n, d, generator=gen), torch.randn(kv_heads, n, d, generator=gen)

    def flashed(qs: Any, base: int, top: int, start: int, end: int) -> Any:
        return flash.attend_flash(0.125, qs, keys[:, :end], values[:, :end], flash.flash_plan(torch.arange(base, top), end))

    def chunked(size: int) -> Any:
        return _in_chunks(q, size, flashed)

    whole = chunked(n)
    assert torch.equal(chunked(37), whole) and torch.equal(chunked(5), whole)
    torch.testing.assert_close(whole.double(), _reference_attention(q, keys, values, torch.arange(n), None),
                               atol=1e-5, rtol=1e-4)


def _prefilled(rt: Any, ids: list[int], chunk: int | None) -> Any:
    from trtkv.runtime.batch import make_sequence, prefill_chunk

    seq = make_sequence(rt, ids, max_tokens=MAX_TOKENS, end_id=-1)
    seq.start(rt)
    while not prefill_chunk(rt, seq, chunk):
        pass
    return seq


@pytest.mark.slow
@pytest.mark.parametrize("window", [None, 40])
def test_decode_attention_row_does_not_depend_on_the_other_rows(window: int | None) -> None:
    """attend_decode_rows: a row alone, beside rows needing fewer and many more key tiles, in another slot: bit-equal
    every time, and equal to softmax attention over its visible keys."""
    import torch

    from trtkv.runtime.key_tiles import attend_decode_rows

    gen = torch.Generator().manual_seed(2)
    heads, kv_heads, d = 6, 2, 16

    def row(p: int, kept: int | None = None) -> tuple[Any, Any, Any, int, int]:
        n = p + 1 if kept is None else kept  # a sliding layer's cache returns only its last tokens
        keys, values = torch.randn(kv_heads, n, d, generator=gen), torch.randn(kv_heads, n, d, generator=gen)
        return torch.randn(heads, d, generator=gen), keys, values, p + 1 - n, p

    ours = row(100, 40 if window else None)
    others = [row(3), row(300, 40 if window else None), row(64)]

    def run(rows: list[Any]) -> Any:
        return attend_decode_rows(0.25, torch.stack([r[0] for r in rows]), [r[1:] for r in rows], window)

    alone = run([ours])[0]
    assert torch.equal(run([others[0], ours])[1], alone)
    assert torch.equal(run([*others, ours])[3], alone)
    assert torch.equal(run([ours, others[1]])[0], alone)
    q, keys, values, first, p = ours
    lo = 0 if window is None else p - window + 1
    k = keys[:, lo - first:].repeat_interleave(heads // kv_heads, 0)
    v = values[:, lo - first:].repeat_interleave(heads // kv_heads, 0)
    want = torch.softmax((q[:, None] @ k.transpose(1, 2)) * 0.25, -1) @ v  # (H, 1, d)
    torch.testing.assert_close(alone, want.reshape(-1), atol=1e-5, rtol=1e-5)


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
@pytest.mark.parametrize("concurrency", [4])
def test_greedy_answers_equal_solo_under_load(setup: dict[str, Any], concurrency: int) -> None:
    """Half the requests start at once, the rest join while those decode; one is cancelled after 2 tokens; small
    prefill chunks (max_num_tokens 24) so prompts are prefilled between decode steps."""
    from trtkv.runtime.batch import Batcher, make_sequence

    rt = setup["rt"]
    prompts = [setup["prompts"][i] for i in (0, 1, 3, 5, 7)]  # Egypt, a quiz prompt, two short, the long one
    solo = [rt.generate(p, max_tokens=MAX_TOKENS, end_id=-1) for p in prompts]
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
        order = [n - 2, *range(n - 2), n - 1]  # the long prompt first: others decode while it is chunked
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
    assert batcher.peak_batch >= 2  # they really ran together (short answers finish before the last ones join)
    egypt = rt.tokenizer.decode(results[0])
    print(f"c{concurrency} (peak batch {batcher.peak_batch}): {EGYPT!r} -> {egypt!r}")
