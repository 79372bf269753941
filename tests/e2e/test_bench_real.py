"""`trtkv bench` against the real chain on the CPU recipe: `trtkv repo` + `trtkv serve` (bundled tritonserver, the
reference runtime on the calibrated FP8-KV checkpoint), short outputs, every metric and accuracy task, and an
impossible SLO that must make the run exit non-zero. Uses the engine the session's chain run calibrated and built."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import read_results, served_chain_recipe
from trtkv.cli import main
from trtkv.contracts.bench_doc import RequestRecord, RequestRecordDoc
from trtkv.measures.metrics import summarize_level

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RECIPE = "smollm2_fp8kv"


@pytest.fixture(scope="module")
def real_server(tmp_path_factory: pytest.TempPathFactory, smollm2_engine: Path) -> Iterator[tuple[list[str], Path]]:
    """repo + serve into temp folders (the session's calibrated engine linked in), one instance, free ports; always
    stopped."""
    with served_chain_recipe(tmp_path_factory.mktemp("real"), RECIPE, smollm2_engine, ["triton.instance_count=1"]) as served:
        yield served


def test_bench_against_real_server(real_server: tuple[list[str], Path], tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    overrides, engines = real_server
    workload = ["bench.concurrency=[1,2]", "bench.num_requests=3", "bench.warmup_requests=1", "bench.input_tokens=32",
                "bench.output_tokens=4", "bench.quiz_items=3", "bench.needle_context_lengths=[160]",
                "probe.needle_depths=[0.5]", "bench.thresholds=[]", "bench.tasks=[quiz,golden,needle]"]  # fidelity: test_fidelity
    out = tmp_path / "bench"
    code = main(["bench", RECIPE, *overrides, *workload, "--golden-prompts", "2", "--no-progress", "--output", str(out),
                 "--slo", "time_to_first_token.p50<=0.001", "--slo", "quiz.accuracy>=0"])
    printed = capsys.readouterr().out
    assert code == 1, printed  # the impossible SLO fails, the run still writes everything
    assert "SLO breaches" in printed and "time_to_first_token.p50<=0.001" in printed
    data = read_results(out)
    assert data["endpoint"]["source"].endswith("server.json")  # URL found through `trtkv serve`'s server.json
    records = [RequestRecord.from_doc(RequestRecordDoc(**r)) for r in data["records"]]
    latency = [r for r in records if r.phase == "latency"]
    assert len(latency) == 6 and all(r.ok for r in latency)
    for r in latency:
        assert 0 < r.ttft_ms() <= r.request_latency_ms()
        assert r.input_tokens == 32
        assert r.output_tokens() == sum(r.response_tokens) <= 4 and r.output_tokens() >= 1
        assert len([t for t in r.response_texts if t]) == len(r.content_indices())
    assert data["token_count_check"]["equal"] == data["token_count_check"]["requests"]
    for level, summary in data["levels"].items():
        again = summarize_level([r for r in latency if r.level == level])
        for metric in ("time_to_first_token", "inter_token_latency", "request_latency", "output_sequence_length",
                       "input_sequence_length", "output_token_throughput", "request_throughput"):
            for stat, value in summary[metric].items():
                if isinstance(value, float):
                    assert again[metric][stat] == pytest.approx(value, abs=1e-6), (level, metric, stat)
    acc = data["accuracy"]
    assert acc["quiz"]["total"] == 3 and acc["quiz"]["failed"] == 0
    assert acc["golden"]["total"] == 2 and 0.0 <= acc["golden"]["agreement"] <= 1.0
    assert acc["needle"]["total"] == 1 and acc["needle"]["failed"] == 0
    assert (engines / RECIPE / "golden.json").is_file()
    failed = {(r["slo"], r["passed"]) for r in data["slo"]["results"]}
    assert ("time_to_first_token.p50<=0.001", False) in failed and ("quiz.accuracy>=0", True) in failed
    for name in ("results.csv", "results.md", "requests.csv", "latency_distributions.png", "throughput.png",
                 "accuracy.png", "manifest.json"):
        assert (out / name).is_file(), name


def test_bench_sweep_input_two_lengths(real_server: tuple[list[str], Path], tmp_path: Path) -> None:
    """`--sweep-input` at two lengths on the reference runtime (the server above): per length the latency level, the
    ITL/TTFT fits against input length, the plot."""
    overrides, _ = real_server
    out = tmp_path / "sweep"
    code = main(["bench", RECIPE, *overrides, "bench.concurrency=[1]", "bench.num_requests=2", "bench.warmup_requests=1",
                 "bench.input_tokens=32",  # one of the sweep's lengths: no extra level at the recipe's own length
                 "bench.output_tokens=4", "bench.thresholds=[]", "--tasks", "none", "--sweep-input", "32,256",
                 "--no-progress", "--output", str(out)])
    assert code == 0
    res = read_results(out)
    level = res["sweep"]["levels"]["concurrency=1"]
    assert res["sweep"]["input_tokens"] == [32, 256] and level["input_tokens"] == [32.0, 256.0]
    assert level["itl_fit"] is not None and level["ttft_fit"]["slope"] > 0  # a longer prompt takes longer to prefill
    assert all(len(level["samples"][str(n)]["ttft_ms"]) == 2 for n in (32, 256))
    # the client's own cost per length (trtkv.bench.load.levels), and the recipe's own length's level carries it too
    assert set(level["client"]) == {"32", "256"} and all(c["workers"] >= 1 for c in level["client"].values())
    assert res["levels"]["concurrency=1"]["client"]["workers"] >= 1
    assert (out / "itl_vs_input.png").stat().st_size > 0
    assert {r["level"] for r in res["records"] if r["phase"] == "latency"} == {"input=32 concurrency=1",
                                                                               "input=256 concurrency=1"}


def test_prefix_workload_hits_the_reference_runtimes_block_cache(real_server: tuple[list[str], Path],
                                                                tmp_path: Path) -> None:
    """bench.prefix on the reference runtime (the server above, KV block reuse on by default, blocks of 32 tokens):
    the counters the server reports on Triton's /metrics show hits where prefixes repeat, and more than the shared
    prefixes alone could give: later turns hit their session's history (#55). One level, 3 sessions x 2 turns."""
    overrides, _ = real_server
    out = tmp_path / "prefix"
    code = main(["bench", RECIPE, *overrides, "bench.concurrency=[1]", "bench.num_requests=6", "bench.warmup_requests=1",
                 "bench.input_tokens=72", "bench.output_tokens=4", "bench.prefix.shared_tokens=40",
                 "bench.prefix.groups=1", "bench.prefix.turns=2", "bench.prefix.turn_tokens=16",
                 "bench.thresholds=[]", "--tasks", "none", "--no-progress", "--output", str(out)])
    assert code == 0
    res = read_results(out)
    level = res["prefix"]["concurrency=1"]
    assert level["source"].endswith("/metrics"), level
    device = level["tiers"]["device"]
    first_turns = level["requests_per_turn"]["1"]
    assert first_turns == 3 and level["requests_per_turn"]["2"] == 3
    # 6 prompts looked up; the shared prefix gives one 32-token block to the 2nd and 3rd sessions (64 tokens); the rest
    # comes from later turns hitting their own first turn's blocks (72-token prompts: 2 blocks each)
    assert device["queries"] >= 6 * 72 and device["hits"] > 2 * 32, level
    assert level["tiers"]["host"]["hits"] == 0  # no host tier configured (host_tier_bytes: 0)
    # the plan's prediction beside the server's rate (PlanFigures.prefix): the pool holds everything, so the whole
    # reusable share, (32 + 64) of (72 + 92) prompt tokens; the server's is lower by the first session's cold prefix
    assert level["predicted"]["device"] == pytest.approx(96 / 164, abs=1e-4) and level["predicted"]["host"] == 0
    assert level["predicted"]["routing"] == "one engine (no routing)"
    turns = [r["turn"] for r in res["records"] if r["phase"] == "latency"]
    assert sorted(turns) == [1, 1, 1, 2, 2, 2]
