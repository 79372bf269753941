"""Metrics from synthetic records, results writing, and recomputing every figure from results.json's raw records."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from trtkv.bench import runner
from trtkv.bench.outputs import results_files
from trtkv.bench.outputs.slo import parse_slo
from trtkv.bench.transport.client import Endpoint
from trtkv.contracts.bench_doc import ERROR, OK, TIMEOUT, BenchResults, RequestRecord
from trtkv.measures.metrics import summarize_level
from trtkv.recipe import load_recipe

MS = 1_000_000


def make(i: int, level: str, send_ms: float, gaps_ms: list[float], tokens: list[int], status: str = OK) -> RequestRecord:
    rec = RequestRecord(f"{level}-{i}", "latency", level, i, input_tokens=64, max_tokens=16)
    rec.send_ns = round(send_ms * MS)
    t = send_ms
    for gap, n in zip(gaps_ms, tokens, strict=True):
        t += gap
        rec.response_ns.append(round(t * MS))
        rec.response_texts.append(" a" * n)
        rec.response_tokens.append(n)
    rec.status = status
    rec.end_ns = round(t * MS)
    if status != OK:
        rec.error = "synthetic failure"
    return rec


def test_per_request_metrics() -> None:
    rec = make(0, "c1", 100.0, [10.0, 5.0, 9.0, 1.0], [1, 1, 3, 0])  # the last is an empty final response
    assert rec.ttft_ms() == pytest.approx(10.0)
    assert rec.request_latency_ms() == pytest.approx(25.0)
    assert rec.output_tokens() == 5
    assert rec.itl_ms() == pytest.approx(14.0 / 4)  # token-weighted: (gap total) / tokens after the first response
    assert make(1, "c1", 0.0, [7.0], [1]).itl_ms() is None


def test_level_summary_counts_failures_and_throughput() -> None:
    recs = [make(i, "c1", i * 20.0, [10.0, 5.0, 5.0], [1, 1, 1]) for i in range(4)]
    recs.append(make(9, "c1", 30.0, [2.0], [1], status=ERROR))
    recs.append(make(10, "c1", 40.0, [40.0], [0], status=TIMEOUT))
    s = summarize_level(recs)
    assert s["request_count"]["ok"] == 4 and s["request_count"][ERROR] == 1 and s["request_count"][TIMEOUT] == 1
    assert s["time_to_first_token"]["count"] == 4 and s["time_to_first_token"]["avg"] == pytest.approx(10.0)
    duration_s = (80.0 - 0.0) / 1000  # first send 0 ms, last end 60 + 20 = 80 ms
    assert s["benchmark_duration"]["avg"] == pytest.approx(duration_s)
    assert s["output_token_throughput"]["avg"] == pytest.approx(12 / duration_s)
    assert s["request_throughput"]["avg"] == pytest.approx(4 / duration_s)


def _assembled(tmp_path: Path, interrupted: str | None = None) -> tuple[BenchResults, dict[str, list[RequestRecord]]]:
    recipe = load_recipe("smollm2_fp8kv")
    by_level = {
        "concurrency=1": [make(i, "concurrency=1", i * 30.0, [12.0, 4.0, 4.0, 4.0], [1, 1, 1, 1]) for i in range(6)],
        "concurrency=2": [make(i, "concurrency=2", i * 10.0, [20.0, 6.0, 6.0], [1, 2, 1]) for i in range(6)]
        + [make(7, "concurrency=2", 5.0, [1.0], [0], status=TIMEOUT)],
    }
    records = [r for recs in by_level.values() for r in recs]
    ep = Endpoint("127.0.0.1:1", "grpc", "ensemble", source="test")
    slos = [parse_slo("time_to_first_token.p99<=15"), parse_slo("quiz.accuracy>=0.5")]
    out = runner.assemble(recipe, ep, runner.BenchOptions(), records, by_level, [], {}, {}, slos,
                          {"requests": 12, "equal": 12, "max_abs_diff": 0}, interrupted, "now", 1.0)
    return out, by_level  # results.json's model, as run_bench writes it


def test_results_files_and_recompute_from_raw_records(tmp_path: Path) -> None:
    out, by_level = _assembled(tmp_path)
    plots = runner.write_all(tmp_path, out, by_level)
    assert set(plots) == {"latency_distributions.png", "throughput.png"}
    assert all((tmp_path / p).stat().st_size > 1000 for p in plots)
    data = json.loads((tmp_path / "results.json").read_text())
    assert not data["partial"]
    # every summary figure recomputes from the raw records
    loaded = BenchResults.load(tmp_path)
    assert loaded is not None
    raw = [RequestRecord.from_doc(r) for r in loaded.records]
    assert len(raw) == 13
    for level, summary in data["levels"].items():
        again = summarize_level([r for r in raw if r.level == level])
        for metric in ("time_to_first_token", "inter_token_latency", "request_latency", "output_sequence_length"):
            for stat in ("avg", "min", "max", "std", "p50", "p90", "p95", "p99"):
                assert again[metric][stat] == pytest.approx(summary[metric][stat], abs=1e-6), (level, metric, stat)
        assert again["output_token_throughput"]["avg"] == pytest.approx(summary["output_token_throughput"]["avg"])
    assert data["levels"]["concurrency=2"]["request_count"]["failed"] == 1
    # SLOs: p99 TTFT 20 ms at concurrency=2 breaks <=15; quiz was not run -> not measured -> failed
    failed = [(r["slo"], r["where"]) for r in data["slo"]["results"] if not r["passed"]]
    assert failed == [("time_to_first_token.p99<=15", "concurrency=2"), ("quiz.accuracy>=0.5", "quiz")]
    assert data["slo"]["passed"] is False
    rows = list(csv.reader((tmp_path / "results.csv").open()))
    assert rows[0][:4] == ["level", "metric", "unit", "avg"]
    assert sum(1 for r in rows if r[1] == "time_to_first_token") == 2
    requests = list(csv.DictReader((tmp_path / "requests.csv").open()))
    assert len(requests) == 13 and {r["status"] for r in requests} == {"ok", "timeout"}
    md = (tmp_path / "results.md").read_text()
    assert "| concurrency=2 |" in md and "FAILED" in md and "How tokens are counted" in md


def test_results_json_is_the_model_the_runner_builds(tmp_path: Path) -> None:
    """results.json is BenchResults' document (the writer's model), and the report's reader loads the same fields."""
    out, by_level = _assembled(tmp_path)
    runner.write_all(tmp_path, out, by_level)
    data = json.loads((tmp_path / "results.json").read_text())
    loaded = BenchResults.load(tmp_path)
    assert loaded is not None and loaded.document() == data
    assert list(data)[:4] == ["schema", "recipe", "kv_cache", "endpoint"] and data["schema"] == runner.SCHEMA
    assert loaded.endpoint is not None and loaded.endpoint.protocol == "grpc" and "endpoint_type" not in data["endpoint"]
    assert loaded.slo is not None and loaded.slo.passed is False and loaded.workload is not None


def test_partial_results_say_so(tmp_path: Path) -> None:
    out, by_level = _assembled(tmp_path, interrupted="latency sweep")
    runner.write_all(tmp_path, out, by_level)
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["partial"] is True and data["interrupted_during"] == "latency sweep"
    assert "Partial results" in (tmp_path / "results.md").read_text()


def test_levels_are_typed_and_written_as_summarized(tmp_path: Path) -> None:
    """results.json's levels are BenchLevel models: each level is written key for key in summarize_level's order (files
    stay byte-identical to the dicts the bench computes), and the report reads metrics as fields."""
    out, by_level = _assembled(tmp_path)
    for label, recs in by_level.items():
        assert json.dumps(out.document()["levels"][label]) == json.dumps(summarize_level(recs))
    loaded = BenchResults.model_validate(out.document())
    ttft = loaded.levels["concurrency=1"].time_to_first_token
    assert ttft is not None and ttft.unit == "ms" and ttft.count == 6 and ttft.p50 == pytest.approx(12.0)
    assert loaded.levels["concurrency=2"].request_count["failed"] == 1


DATA = Path(__file__).resolve().parents[1] / "data" / "bench_results"


@pytest.mark.parametrize("folder", sorted(p.parent for p in DATA.rglob("results.md")), ids=lambda p: p.name)
def test_results_md_and_csv_of_a_real_file_are_written_as_before(folder: Path, tmp_path: Path) -> None:
    """results.md and results.csv from a real results.json read back: byte for byte what the writers wrote when they
    read results.json's dict (tests/data/bench_results/README.md), now that they read the typed model."""
    loaded = BenchResults.load(folder)
    assert loaded is not None
    results_files.write_md(tmp_path / "results.md", loaded, [])
    results_files.write_csv(tmp_path / "results.csv", loaded)
    for name in ("results.md", "results.csv"):
        assert (tmp_path / name).read_bytes() == (folder / name).read_bytes(), name
