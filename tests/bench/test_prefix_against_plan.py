"""results.json's prefix levels carry the plan's predicted hit rates beside the server's (#55): bench attaches the
level's own concurrency's figures, the console, report and compare print measured against predicted, the difference
and the routing the plan assumed."""

from __future__ import annotations

from trtkv.bench.outputs.results import prefix_lines
from trtkv.contracts import BenchResults, PredictedHits, PrefixLevel, PrefixPrediction, PrefixTier
from trtkv.contracts.prefix import with_prediction


def _level(device: float, host: float | None = 0.0) -> PrefixLevel:
    tiers = {"device": PrefixTier(queries=1000, hits=int(device * 1000), hit_rate=device)}
    if host is not None:
        tiers["host"] = PrefixTier(queries=1000, hits=int(host * 1000), hit_rate=host)
    return PrefixLevel(source="http://127.0.0.1:8002/metrics", tiers=tiers, ttft_ms_p50_per_turn={1: 120.0, 2: 80.0})


def _plan() -> PrefixPrediction:
    def at(device: float, host: float) -> PredictedHits:
        return PredictedHits(device=device, host=host, routing="one engine (no routing)", basis="device 256 tokens")

    return PrefixPrediction(kv_format="fp8", block_tokens=32, device_tokens=256, host_tokens=186,
                            levels={1: at(0.5, 0.1), 2: at(0.4, 0.2)})


def test_each_level_gets_its_own_concurrencys_prediction() -> None:
    got = with_prediction({"concurrency=1": _level(0.45, 0.12), "concurrency=2": _level(0.3, 0.1),
                           "concurrency=4": _level(0.2)}, _plan())
    assert got["concurrency=1"].predicted is not None and got["concurrency=1"].predicted.device == 0.5
    assert got["concurrency=2"].predicted is not None and got["concurrency=2"].predicted.host == 0.2
    assert got["concurrency=4"].predicted is None  # the plan has no such level
    assert with_prediction({"concurrency=1": _level(0.45)}, None)["concurrency=1"].predicted is None


def test_the_line_says_measured_predicted_difference_and_routing() -> None:
    level = with_prediction({"concurrency=2": _level(0.3, 0.25)}, _plan())["concurrency=2"]
    assert level.against_plan() == [("device", 0.3, 0.4), ("host", 0.25, 0.2)]
    text = level.against_plan_text()
    assert text == ("device 0.300 (plan 0.400, -0.100), host 0.250 (plan 0.200, +0.050); "
                    "routing: one engine (no routing)")
    (line,) = prefix_lines(BenchResults(prefix={"concurrency=2": level}))
    assert line.startswith("prefix cache concurrency=2: hit rate device 0.300 (plan 0.400, -0.100)")
    assert line.endswith("TTFT p50 ms turn 1 120.0, turn 2 80.0")


def test_a_second_tier_the_server_does_not_report_is_shown_as_unmeasured() -> None:
    """vLLM without its offloading connector reports the device tier only: the plan's host rate shows unmeasured."""
    level = with_prediction({"concurrency=1": _level(0.45, host=None)}, _plan())["concurrency=1"]
    assert level.against_plan() == [("device", 0.45, 0.5), ("host", None, 0.1)]
    assert "host - (plan 0.100)" in level.against_plan_text()
    vllm = PrefixLevel(source="s", tiers={"device": PrefixTier(queries=10, hits=5, hit_rate=0.5),
                                          "connector": PrefixTier(queries=10, hits=1, hit_rate=0.1)})
    assert vllm.against_plan_text() == "device 0.500, connector 0.100; no plan prediction"
