"""The OpenAI protocol's pieces that need no server, and the AIPerf export against numpy and AIPerf's layout."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from trtkv.bench.outputs import aiperf_export
from trtkv.bench.outputs.results import failure_summary
from trtkv.bench.transport.client import Endpoint, SamplingParams
from trtkv.bench.transport.openai import event_text, request_body
from trtkv.contracts.bench_doc import OK, BenchEndpoint, BenchResults, RequestRecord
from trtkv.core.errors import TrtkvError


def test_request_bodies_and_events() -> None:
    ep = Endpoint("127.0.0.1:8000", "openai", "m")
    body = request_body(ep, "Hi", SamplingParams(max_tokens=4))
    assert body["prompt"] == "Hi" and body["stream"] and body["stream_options"] == {"include_usage": True}
    assert "top_k" not in body and body["temperature"] == 0.0  # greedy: no non-standard field needed
    ep.endpoint_type = "chat"
    assert request_body(ep, "Hi", SamplingParams(max_tokens=4))["messages"] == [{"role": "user", "content": "Hi"}]
    assert event_text({"choices": [{"text": " Paris"}]}, chat=False) == " Paris"
    assert event_text({"choices": [{"delta": {"content": " Rome"}}]}, chat=True) == " Rome"
    assert event_text({"choices": [], "usage": {"completion_tokens": 3}}, chat=False) == ""


def _record(i: int, ttft_ms: float, gaps_ms: list[float], ok: bool = True) -> RequestRecord:
    rec = RequestRecord(f"r{i}", "latency", "concurrency=1", i, input_tokens=8, max_tokens=len(gaps_ms) + 1)
    rec.send_ns = i * 10**9
    t = rec.send_ns + int(ttft_ms * 1e6)
    rec.response_ns = [t]
    for gap in gaps_ms:
        t += int(gap * 1e6)
        rec.response_ns.append(t)
    rec.response_tokens = [1] * len(rec.response_ns)
    rec.response_texts = ["x"] * len(rec.response_ns)
    rec.end_ns, rec.status = t, OK if ok else "error"
    if not ok:
        rec.error = "Connection refused"
    return rec


def test_aiperf_export_statistics_and_goodput(tmp_path: Path) -> None:
    recs = [_record(i, 100.0 + 50 * i, [10.0 + i] * 3) for i in range(5)] + [_record(9, 1.0, [1.0], ok=False)]
    doc = aiperf_export.write_level(tmp_path, recs, {"time_to_first_token": 200.0, "inter_token_latency": 12.5})
    ttft = [100.0 + 50 * i for i in range(5)]
    got = doc["time_to_first_token"]
    assert got["unit"] == "ms" and got["count"] == 5
    for p in aiperf_export.PERCENTILES:
        assert got[f"p{p}"] == pytest.approx(np.percentile(ttft, p), abs=1e-6)
    assert got["std"] == pytest.approx(np.std(ttft), abs=1e-6) and got["sum"] == pytest.approx(sum(ttft), abs=1e-6)
    assert doc["inter_token_latency"]["avg"] == pytest.approx(np.mean([10.0 + i for i in range(5)]), abs=1e-6)
    assert doc["time_to_second_token"]["p50"] == pytest.approx(12.0, abs=1e-6)
    # good: TTFT <= 200 and ITL <= 12.5 -> requests 0, 1, 2
    assert doc["good_request_count"]["avg"] == 3 and doc["error_request_count"]["avg"] == 1
    assert doc["error_summary"] == [{"error_details": {"message": "Connection refused"}, "count": 1}]
    on_disk = json.loads((tmp_path / "profile_export_aiperf.json").read_text())
    assert on_disk["schema_version"] == "1.4" and set(on_disk["request_latency"]) == {
        "unit", "avg", "p1", "p5", "p10", "p25", "p50", "p75", "p90", "p95", "p99", "min", "max", "std", "count", "sum"}
    rows = (tmp_path / "profile_export_aiperf.csv").read_text().splitlines()
    assert rows[0] == "Metric,avg,min,max,sum,p1,p5,p10,p25,p50,p75,p90,p95,p99,std"
    assert any(r.startswith("Time to First Token (ms),200.00,100.00,300.00,1000.00") for r in rows)
    assert "Goodput (requests/sec)" in "\n".join(rows)
    written = BenchResults(records=[r.to_doc() for r in recs],
                           endpoint=BenchEndpoint(url="h:1", protocol="openai", model="m"))  # as results.json holds them
    summary = failure_summary(written)
    assert summary is not None and "1 of 6 requests failed" in summary and "went away" in summary


def test_goodput_parsing() -> None:
    assert aiperf_export.parse_goodput("time_to_first_token:500 inter_token_latency:100") == {
        "time_to_first_token": 500.0, "inter_token_latency": 100.0}
    with pytest.raises(TrtkvError, match="Allowed: request_latency"):
        aiperf_export.parse_goodput("ttft:500")
    with pytest.raises(TrtkvError, match="not a number"):
        aiperf_export.parse_goodput("time_to_first_token:fast")
