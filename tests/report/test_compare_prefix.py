"""`trtkv compare` puts bench.prefix's measured hit rates per tier and TTFT per turn of two KV formats side by side,
read from each recipe's results.json "prefix" record (trtkv.contracts.artifacts.PrefixLevel) (#55)."""

from __future__ import annotations

import json
from pathlib import Path

from trtkv.contracts import BenchResults, PredictedHits, PrefixLevel, PrefixTier
from trtkv.recipe import layout, load_recipe
from trtkv.report.compare import prefix_section
from trtkv.report.summary import collect


def _results(recipe_name: str, device: float, ttft2: float, predicted: float | None = None) -> None:
    recipe = load_recipe(recipe_name)
    folder = layout.bench_dir(recipe)
    folder.mkdir(parents=True)
    doc = BenchResults(recipe=recipe_name, prefix={"concurrency=1": PrefixLevel(
        source="http://127.0.0.1:8002/metrics",
        tiers={"device": PrefixTier(queries=1000, hits=int(device * 1000), hit_rate=device),
               "host": PrefixTier(queries=1000, hits=0, hit_rate=0.0)},
        requests_per_turn={1: 3, 2: 3}, ttft_ms_p50_per_turn={1: 120.0, 2: ttft2},
        predicted=None if predicted is None else PredictedHits(device=predicted, host=0.0, routing="one engine (no routing)",
                                                               basis="device 16,384 tokens"))})
    (folder / "results.json").write_text(json.dumps(doc.document()))


def test_compare_shows_each_formats_prefix_hit_rates_and_ttft(engines_tmp: Path) -> None:
    _results("smollm2_fp16kv", 0.25, 90.0)
    _results("smollm2_fp8kv", 0.5, 60.0, predicted=0.585)
    from trtkv.plan.handoff import figures

    recipes = [load_recipe(n) for n in ("smollm2_fp16kv", "smollm2_fp8kv")]
    rows = [collect(r, figures(r)) for r in recipes]
    lines = prefix_section(rows)
    assert "## Prefix reuse (bench.prefix)" in lines
    (fp16,) = [x for x in lines if x.startswith("| smollm2_fp16kv |")]
    (fp8,) = [x for x in lines if x.startswith("| smollm2_fp8kv |")]
    assert "device 0.25" in fp16 and "turn 2: 90" in fp16
    assert "device 0.5" in fp8 and "host 0" in fp8 and "turn 2: 60" in fp8
    # the plan's prediction beside the server's rate, the difference and the routing assumed
    assert "device 0.500 (plan 0.585, -0.085), host 0.000 (plan 0.000, +0.000); routing: one engine (no routing)" in fp8
    assert fp16.endswith("| device 0.250, host 0.000; no plan prediction |")
    assert prefix_section([{"recipe": "x"}]) == []  # no prefix workload measured: no section


def test_report_puts_the_servers_rates_against_the_plans(engines_tmp: Path) -> None:
    from trtkv.plan.handoff import figures
    from trtkv.report.summary import write_report

    _results("smollm2_fp8kv", 0.5, 60.0, predicted=0.585)
    recipe = load_recipe("smollm2_fp8kv")
    out = write_report(recipe, figures(recipe), engines_tmp / "report")
    md = (out / "report.md").read_text()
    assert "## Prefix reuse (bench.prefix): hit rate per tier, the server's against the plan's" in md
    assert ("- concurrency=1: device 0.500 (plan 0.585, -0.085), host 0.000 (plan 0.000, +0.000); routing: one engine "
            "(no routing)") in md
    assert json.loads((out / "report.json").read_text())["prefix"]["concurrency=1"]["predicted"]["device"] == 0.585
