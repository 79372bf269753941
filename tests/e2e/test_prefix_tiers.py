"""The reference runtime's host KV tier served for real (#55): `trtkv repo` + `trtkv serve` of the CPU recipe with a
device block pool of one 256-token sequence (build.max_batch_size 1 x build.max_seq_len 256: 2,949,120 bytes of FP8
KV) and `triton.kv_host_tier_gib_per_replica` 0.004 (4,294,967 bytes, 372 tokens), then bench.prefix's workload: four
64-token shared prefixes, two turns per session. Each cycle of four sessions stores 8 prefix blocks and 4 history
blocks, more than the device tier's 8: prefixes are evicted to the host tier and come back from it. The hits show in
the trtkv_prefix_cache_*{tier} counters on Triton's /metrics and in bench's PrefixLevel records, beside the plan's
prediction. Uses the session chain's calibrated engine (tests/conftest.py), one server start of its own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import read_results, served_chain_recipe
from trtkv.bench.load.prefix_counters import read_counters
from trtkv.cli import main

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RECIPE = "smollm2_fp8kv"
SMALL_POOL = ["triton.instance_count=1", "build.max_batch_size=1", "build.max_seq_len=256", "build.max_input_len=200",
              "bench.needle_context_lengths=[160]", "bench.fidelity_lengths=[128]",
              "triton.kv_host_tier_gib_per_replica=0.004"]
WORKLOAD = ["bench.concurrency=[1]", "bench.num_requests=16", "bench.warmup_requests=1", "bench.input_tokens=96",
            "bench.output_tokens=4", "bench.prefix.shared_tokens=64", "bench.prefix.groups=4", "bench.prefix.turns=2",
            "bench.prefix.turn_tokens=16", "bench.thresholds=[]"]


@pytest.fixture(scope="module")
def tiered_server(tmp_path_factory: pytest.TempPathFactory, smollm2_engine: Path) -> Iterator[tuple[list[str], Path]]:
    """repo + serve with the small device tier and the host tier, free ports; always stopped."""
    with served_chain_recipe(tmp_path_factory.mktemp("tiers"), RECIPE, smollm2_engine, SMALL_POOL) as served:
        yield served


def test_prefixes_spilled_to_the_host_tier_hit_there(tiered_server: tuple[list[str], Path], tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    overrides, engines = tiered_server
    log = (engines / RECIPE / "serve" / "tritonserver.log").read_text(errors="replace")
    # the served tiers are the recipe's: 256 tokens x 11,520 bytes of FP8 KV, and 0.004 GiB
    assert "prefix cache: on, blocks of 32 tokens, device tier 2949120 bytes, host tier 4294967 bytes" in log
    metrics = next(o.split("=", 1)[1] for o in overrides if o.startswith("triton.metrics_port="))
    url = f"http://127.0.0.1:{metrics}/metrics"
    before, _ = read_counters(url)
    out = tmp_path / "bench"
    code = main(["bench", RECIPE, *overrides, *WORKLOAD, "--tasks", "none", "--no-progress", "--output", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    after, source = read_counters(url)
    assert source == url
    # Triton's /metrics: the host tier served tokens (a prefix evicted from the device tier came back from the host)
    host_hits = after["host"][1] - before.get("host", (0.0, 0.0))[1]
    assert host_hits >= 32 and host_hits % 32 == 0, (before, after)  # whole 32-token blocks
    level = read_results(out)["prefix"]["concurrency=1"]
    assert level["requests_per_turn"] == {"1": 8, "2": 8}
    tiers = level["tiers"]
    # bench's PrefixLevel: both tiers hit, in whole blocks, of the same prompt tokens looked up
    assert tiers["device"]["queries"] == tiers["host"]["queries"] >= 8 * 96 + 8 * 116
    assert tiers["host"]["hits"] >= 32 and tiers["device"]["hits"] >= 32
    assert tiers["host"]["hits"] % 32 == 0 and tiers["device"]["hits"] % 32 == 0
    # the plan's prediction beside it (PlanFigures.prefix): the same pools, a host share, the routing assumed
    predicted = level["predicted"]
    assert predicted["host"] > 0 and predicted["device"] > 0
    assert predicted["routing"] == "one engine (no routing)" and "exclusive" in predicted["basis"]
    assert "prefix cache concurrency=1: hit rate device " in printed and "host " in printed
    assert "(plan " in printed and "routing: one engine (no routing)" in printed
