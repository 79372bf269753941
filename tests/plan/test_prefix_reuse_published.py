"""trtkv's prefix-reuse TTFT (trtkv.plan.prefix_reuse.turn_ttft) held to published host-tier measurements with a known
setup and a quoted workload (tests/data/published_offload/, one file per source): the predicted TTFT gain (recompute
over load from the host tier) within 30% (#55). Nothing was fitted to them: the prefill is trtkv's step model, the copy
the GPU's host link (trtkv/data/host_links.json; its H100 figure is the DMA microbenchmark of the vLLM post held here,
a separate measurement from its TTFT). A measurement trtkv cannot price says why in its file ("unpriced"); the test
prints the table with the misses. Shown failing on main's code: trtkv.plan.prefix_reuse did not exist (ImportError)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import speed_cases as sc
from trtkv.kvcache.formats import KVFormat
from trtkv.plan.estimate import kv_cost, model_shape
from trtkv.plan.model import resolve_architecture
from trtkv.plan.prefix import block_floor
from trtkv.plan.prefix_reuse import TurnHits, turn_ttft
from trtkv.plan.speed import kernels_for
from trtkv.platform.host_link import host_link_of

DATA = sorted((sc.ROOT / "tests" / "data" / "published_offload").glob("*.json"))
BAND = 0.30


def predicted_gain(setup: dict, m: dict) -> float:
    """Recompute over load: trtkv's TTFT of the prompt without reuse / with every whole block of it but the last
    token loaded from the host tier (the device cache off, as the runs were)."""
    prompt = m["prompt_tokens"]
    r = sc.recipe_for(setup["model_config"], setup["gpu"], setup["engine"], setup["kv_dtype"], prompt,
                      m["output_tokens"], [m["concurrency"]], 8192, tp=setup["tp"])
    arch = resolve_architecture(r)
    k = kernels_for(r.hardware.gpu, setup["engine"])
    kv = kv_cost(arch, r, KVFormat(setup["kv_dtype"]), ())
    hits = TurnHits(prompt, 0.0, block_floor(prompt - 1, setup["block_tokens"]))
    full, loaded = turn_ttft(k, model_shape(arch, r), kv, hits, m["output_tokens"], m["concurrency"], 8192,
                             host_link_of(r.hardware.gpu))
    return full / loaded


def test_predicted_ttft_gain_within_30_percent_of_published_offload(capsys: pytest.CaptureFixture[str]) -> None:
    docs = [json.loads(Path(p).read_text()) | {"file": Path(p).name} for p in DATA]
    priced, unpriced = [], []
    for doc in docs:
        assert doc["source"]["url"] and doc["quoted"] and doc["setup"]["engine_version"], doc["file"]
        for m in doc["measurements"]:
            if "unpriced" in m:
                unpriced.append((doc["file"], m))
                continue
            gain = predicted_gain(doc["setup"], m)
            priced.append((doc["file"], m, gain, gain / m["ttft_gain"] - 1))
    with capsys.disabled():
        print(f"\n{'source':<40} {'measurement':<22} {'published':>9} {'trtkv':>7} {'error':>7}")
        for file, m, gain, err in priced:
            print(f"{file:<40} {m['id']:<22} {m['ttft_gain']:>8.2f}x {gain:>6.2f}x {err:>+7.1%}")
        for file, m in unpriced:
            print(f"{file:<40} {m['id']:<22} {m['ttft_gain']:>8.2f}x {'-':>7} {'-':>7}  not priced: {m['unpriced']}")
    assert len(priced) >= 2 and unpriced
    for file, m, gain, err in priced:
        assert abs(err) <= BAND, (file, m["id"], gain, m["ttft_gain"])
