"""KV block reuse in the reference runtime (trtkv.runtime.block_reuse): a request whose prompt shares full blocks
with an earlier one is served from the cached blocks, with the same tokens, logits and stored codes as without the
cache (the batch-invariant path: a token's codes and a prefill row do not depend on the chunk); unreferenced blocks
are evicted least recently used first, to the host tier when there is one, and a host hit copies the block back;
the counters count tokens as vLLM's prefix_cache_queries / _hits do."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.runtime.test_runtime import has_quantized_cache, tiny_llama, write_checkpoint, write_engine
from trtkv.runtime import ReferenceRuntime
from trtkv.runtime.batch import Batcher, make_sequence
from trtkv.runtime.block_reuse import BlockPool, chain_keys, make_pool

BLOCK = 8
SHARED = list(range(3, 3 + 4 * BLOCK))  # 4 full blocks of shared prefix


@pytest.fixture(scope="module")
def runtimes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ReferenceRuntime]:
    root = tmp_path_factory.mktemp("reuse")
    model = tiny_llama()
    out = {"none": ReferenceRuntime.load(write_engine(write_checkpoint(model, root / "c0"), root / "e0", model))}
    if has_quantized_cache():
        ckpt = write_checkpoint(model, root / "c1", kv="FP8", kv_factor=0.05)
        out["fp8"] = ReferenceRuntime.load(write_engine(ckpt, root / "e1", model))
    for rt in out.values():
        rt.settings["tokens_per_block"] = BLOCK
    return out


def serve(rt: ReferenceRuntime, prompts: list[list[int]], pool: BlockPool | None, max_tokens: int = 6,
          keep: bool = False) -> list[tuple[list[int], Any]]:
    """Each prompt through a Batcher, one after the other (so a later one can hit the earlier ones' blocks); returns
    (tokens, the sequence) per prompt (keep: the sequence's cache is kept for a look at its codes)."""
    batcher = Batcher(rt, max_batch_size=2, prefix_cache=pool)
    out = []
    try:
        for p in prompts:
            done = threading.Event()
            got: dict[str, Any] = {}

            def on_done(tokens: list[int], error: BaseException | None, got: dict[str, Any] = got,
                        done: threading.Event = done) -> None:
                got["tokens"], got["error"] = list(tokens), error
                done.set()

            seq = make_sequence(rt, p, max_tokens=max_tokens, end_id=-1, on_done=on_done)
            if keep:  # the cache survives _finish for the codes' comparison
                seq.on_token = lambda _t, s=seq, g=got: g.setdefault("cache", s.cache) and None
            batcher.submit(seq)
            assert done.wait(60)
            assert got["error"] is None, got["error"]
            out.append((got["tokens"], seq, got.get("cache")))
    finally:
        batcher.shutdown()
    return out


@pytest.mark.parametrize("kv", ["none", "fp8"])
def test_a_hit_gives_the_same_tokens_and_codes_as_no_cache(runtimes: dict[str, ReferenceRuntime], kv: str) -> None:
    if kv not in runtimes:
        pytest.skip("no quantized cache")
    rt = runtimes[kv]
    first, second = [*SHARED, 90, 91, 92], [*SHARED, 17, 18, 19, 20, 21]
    cached = serve(rt, [first, second], make_pool(rt, device_bytes=1 << 24), keep=True)
    plain = serve(rt, [second], None, keep=True)
    solo = rt.generate(second, max_tokens=6, end_id=-1)
    assert cached[1][1].reused_tokens == len(SHARED)  # the 4 shared blocks came from the cache
    assert cached[1][0] == plain[0][0] == solo
    # the stored codes (K and V of every layer, prompt and answer) byte for byte
    a, b = cached[1][2], plain[0][2]
    for la, lb in zip(a.layers, b.layers, strict=True):
        if hasattr(la, "k_store"):
            for sa, sb in ((la.k_store, lb.k_store), (la.v_store, lb.v_store)):
                va, vb = sa.view(), sb.view()
                assert all(torch.equal(va[k].view(torch.uint8), vb[k].view(torch.uint8)) for k in va)
        else:
            assert torch.equal(la.keys, lb.keys) and torch.equal(la.values, lb.values)


def test_counters_count_tokens_and_later_turns_hit_more(runtimes: dict[str, ReferenceRuntime]) -> None:
    rt = runtimes["none"]
    pool = make_pool(rt, device_bytes=1 << 24)
    turn1 = [*SHARED, 40, 41, 42]
    (t1, _, _), = serve(rt, [turn1], pool)
    turn2 = [*turn1, *t1, 50, 51, 52, 53]  # the session's history + new tokens
    other = [*SHARED, 60, 61]  # another session of the same prefix group
    results = serve(rt, [other, turn2], pool)
    stats = pool.stats()
    assert stats["queries"] == len(turn1) + len(other) + len(turn2)
    hit_other, hit_turn2 = results[0][1].reused_tokens, results[1][1].reused_tokens
    assert hit_other == len(SHARED)
    # turn 2 hits the first turn's prompt and answer blocks: more than the shared prefix
    assert hit_turn2 == (len(turn1) + len(t1) - 1) // BLOCK * BLOCK > hit_other
    assert stats["hits"] == {"device": hit_other + hit_turn2, "host": 0}


def test_lru_eviction_to_the_host_tier_and_back(runtimes: dict[str, ReferenceRuntime]) -> None:
    rt = runtimes["none"]
    probe = make_pool(rt, device_bytes=1 << 24)
    serve(rt, [[*SHARED, 1]], probe, max_tokens=1)
    block_bytes = probe.stats()["tiers"]["device"]["bytes"] // 4
    # a device tier of 4 blocks, a host tier of 8
    pool = make_pool(rt, device_bytes=4 * block_bytes, host_bytes=8 * block_bytes)
    a, b = [*SHARED, 1], [7 + t for t in SHARED] + [2]
    serve(rt, [a, b], pool, max_tokens=1)  # b's 4 blocks evict a's to the host
    s = pool.stats()
    assert s["tiers"]["device"]["blocks"] == 4 and s["tiers"]["host"]["blocks"] == 4
    assert s["evicted_blocks"]["device"] == 4
    (_, seq, _), = serve(rt, [[*SHARED, 5]], pool, max_tokens=1)  # a's prefix: from the host tier
    assert seq.reused_tokens == len(SHARED)
    s = pool.stats()
    assert s["hits"]["host"] == len(SHARED) and s["hits"]["device"] == 0
    assert s["tiers"]["device"]["blocks"] == 4 and s["tiers"]["host"]["blocks"] == 4  # swapped back


def test_no_host_tier_forgets_the_evicted(runtimes: dict[str, ReferenceRuntime]) -> None:
    rt = runtimes["none"]
    probe = make_pool(rt, device_bytes=1 << 24)
    serve(rt, [[*SHARED, 1]], probe, max_tokens=1)
    pool = make_pool(rt, device_bytes=probe.stats()["tiers"]["device"]["bytes"])
    serve(rt, [[*SHARED, 1], [7 + t for t in SHARED] + [2]], pool, max_tokens=1)
    (_, seq, _), = serve(rt, [[*SHARED, 5]], pool, max_tokens=1)
    assert seq.reused_tokens == 0 and pool.stats()["hits"] == {"device": 0, "host": 0}


def test_a_quantized_cache_keeps_more_blocks_in_the_same_bytes(runtimes: dict[str, ReferenceRuntime]) -> None:
    if "fp8" not in runtimes:
        pytest.skip("no quantized cache")
    fp8, bf16 = runtimes["fp8"], runtimes["none"].with_kv_format("bf16")
    budget = 1 << 13  # 8 KiB: 8 fp8 blocks of this model (2 layers x K,V x 2 heads x 16 x 8 tokens x 1 byte)
    held = {}
    for name, rt in (("fp8", fp8), ("bf16", bf16)):
        pool = make_pool(rt, device_bytes=budget)
        serve(rt, [[*SHARED, *SHARED, *SHARED, 1]], pool, max_tokens=1)
        held[name] = pool.stats()["tiers"]["device"]["blocks"]
    assert held["fp8"] >= 2 * held["bf16"] > 0, held


def test_chain_keys_name_the_whole_prefix() -> None:
    a, b = chain_keys([*SHARED, 1], BLOCK), chain_keys([*SHARED[:-1], 99, 1], BLOCK)
    assert len(a) == 4 and a[:3] == b[:3] and a[3] != b[3]
    assert chain_keys([9, *SHARED[1:]], BLOCK)[1] != a[1]  # block 1's tokens equal, its parent not


def test_refusals() -> None:
    from trtkv.runtime.errors import RequestError

    with pytest.raises(RequestError, match="block_tokens 0"):
        BlockPool(0, 10)


def test_plain_path_documents_its_bound(runtimes: dict[str, ReferenceRuntime], monkeypatch: pytest.MonkeyPatch,
                                        tmp_path: Path) -> None:
    """batch_invariant off: a hit is one more prefill chunk; the tokens still match on this tiny model."""
    monkeypatch.setenv("TRTKV_BATCH_INVARIANT", "0")
    rt = runtimes["none"]
    second = [*SHARED, 17, 18]
    cached = serve(rt, [[*SHARED, 9], second], make_pool(rt, device_bytes=1 << 24))
    assert cached[1][1].reused_tokens == len(SHARED)
    assert cached[1][0] == rt.generate(second, max_tokens=6, end_id=-1)


@pytest.mark.slow
def test_smollm2_quiz_prompts_share_their_few_shot_blocks_and_answer_as_without(
        tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> None:
    """The real model (FP8 weights and KV, as smollm2_fp8kv serves): two quiz prompts share the few-shot header, the
    second is served from its blocks and answers token for token as solo."""
    from tests.runtime.test_batch_invariance import invariance_prompts, smollm2_fp8_runtime

    rt = smollm2_fp8_runtime(tmp_path_factory.mktemp("reuse_smol"), smollm2_dir)
    rt.settings["tokens_per_block"] = 16
    prompts = [rt.tokenizer(p, add_special_tokens=False)["input_ids"] for p in invariance_prompts(quiz=2)[1:3]]
    pool = make_pool(rt, device_bytes=1 << 26)
    results = serve(rt, prompts, pool, max_tokens=5)
    assert results[1][1].reused_tokens >= 32, results[1][1].reused_tokens  # 48 here: the few-shot header
    assert results[1][0] == rt.generate(prompts[1], max_tokens=5, end_id=-1)


def test_at_the_same_workload_and_pool_fp8_keeps_more_prefixes_resident(runtimes: dict[str, ReferenceRuntime]) -> None:
    """Two prefix groups taking turns (A, B, A, B) on a pool of 8 KiB: FP8's blocks (1 KiB) keep both groups' 4 blocks
    resident and the second round hits; BF16's (2 KiB) hold one group, each group evicts the other, nothing hits."""
    if "fp8" not in runtimes:
        pytest.skip("no quantized cache")
    a, b = [*SHARED, 1], [7 + t for t in SHARED] + [2]
    rates = {}
    for name, rt in (("fp8", runtimes["fp8"]), ("bf16", runtimes["none"].with_kv_format("bf16"))):
        pool = make_pool(rt, device_bytes=1 << 13)
        serve(rt, [a, b, [*a[:-1], 3], [*b[:-1], 4]], pool, max_tokens=1)
        s = pool.stats()
        rates[name] = s["hits"]["device"] / s["queries"]
    assert rates["fp8"] > 0.4 and rates["bf16"] == 0.0, rates
