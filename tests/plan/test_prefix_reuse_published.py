"""trtkv's prefix-reuse TTFT (trtkv.plan.prefix_reuse) held to published host-tier measurements with a known setup and a
quoted workload (tests/data/published_offload/, one file per source): the predicted TTFT gain within 30% (#55). Two
kinds: a single request (recompute over load from the host tier: turn_ttft), and a workload under load ("kind":
"workload": `plan --estimate` on a recipe built from the file's setup and the measurement's overrides, as a user would
write it; the gain is trtkv's mean TTFT without the host tier over with it). Nothing was fitted to them: the prefill is
trtkv's step model, the copy the GPU's host link (trtkv/data/host_links.json; its H100 figure is the DMA microbenchmark
of the vLLM post held here, a separate measurement from its TTFT), the pools and hit rates trtkv's own. A measurement
trtkv cannot price says why in its file ("unpriced"); the test prints the table with the misses. Shown failing on
main's code: trtkv.plan.prefix_reuse did not exist (ImportError); llm-d's workload rows priced there at 1.00x (99%
device hits on a pool smaller than the running sessions), fixed in prefix_reuse (tests/plan/test_prefix_reuse.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import speed_cases as sc
from trtkv.kvcache.formats import KVFormat
from trtkv.plan.estimate import estimate, kv_cost, model_shape
from trtkv.plan.estimate_model import PrefixReuseRow
from trtkv.plan.model import resolve_architecture
from trtkv.plan.planner import plan
from trtkv.plan.prefix import block_floor
from trtkv.plan.prefix_reuse import TurnHits, turn_ttft
from trtkv.plan.speed import kernels_for
from trtkv.platform.host_link import host_link_of
from trtkv.recipe import load_recipe

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


def workload_row(setup: dict, m: dict, host_gib: float | None) -> PrefixReuseRow:
    """trtkv's estimate row for the measurement's workload at the setup's format and concurrency, with or without the
    host tier."""
    tier = [f"triton.kv_host_tier_gib_per_replica={host_gib}"] if host_gib else []
    r = load_recipe(sc.BASE, [f"model.source={sc.ROOT / setup['model_config']}", *setup["recipe"], *m["recipe"], *tier])
    section = estimate(r, plan(r), use_aiconfigurator=False).prefix
    assert section is not None
    return next(x for x in section.rows if x.format == setup["kv_dtype"])


def workload_gain(setup: dict, m: dict) -> tuple[float, str]:
    """trtkv's TTFT gain of the host tier at the workload, and a note of what it priced (pools, hit rates, TTFTs)."""
    base, tiered = workload_row(setup, m, None), workload_row(setup, m, m["host_tier_gib_per_replica"])
    note = (f"device {base.device_tokens:,} tok (published {setup.get('device_pool_tokens_published', 0):,}), hits "
            f"{base.device_hit_rate:.0%} -> {tiered.device_hit_rate:.0%}+{tiered.host_hit_rate:.0%} host, TTFT "
            f"{base.ttft_ms / 1e3:.2f} -> {tiered.ttft_ms / 1e3:.2f} s (published {m['ttft_s']['baseline']:g} -> "
            f"{m['ttft_s']['tiered']:g} s)")
    return base.ttft_ms / tiered.ttft_ms, note


def test_predicted_ttft_gain_within_30_percent_of_published_offload(capsys: pytest.CaptureFixture[str]) -> None:
    docs = [json.loads(Path(p).read_text()) | {"file": Path(p).name} for p in DATA]
    priced, unpriced = [], []
    for doc in docs:
        assert doc["source"]["url"] and doc["quoted"] and doc["setup"]["engine_version"], doc["file"]
        for m in doc["measurements"]:
            if "unpriced" in m:
                unpriced.append((doc["file"], m))
                continue
            if m.get("kind") == "workload":
                gain, note = workload_gain(doc["setup"], m)
            else:
                gain, note = predicted_gain(doc["setup"], m), ""
            priced.append((doc["file"], m, gain, gain / m["ttft_gain"] - 1, note))
    with capsys.disabled():
        print(f"\n{'source':<40} {'measurement':<22} {'published':>9} {'trtkv':>7} {'error':>7}")
        for file, m, gain, err, note in priced:
            print(f"{file:<40} {m['id']:<22} {m['ttft_gain']:>8.2f}x {gain:>6.2f}x {err:>+7.1%}  {note}")
        for file, m in unpriced:
            print(f"{file:<40} {m['id']:<22} {m['ttft_gain']:>8.2f}x {'-':>7} {'-':>7}  not priced: {m['unpriced']}")
    assert len(priced) >= 6 and unpriced
    assert {doc["setup"]["engine"] for doc in docs} >= {"vllm", "sglang"}
    for file, m, gain, err, _ in priced:
        assert abs(err) <= BAND, (file, m["id"], gain, m["ttft_gain"])
