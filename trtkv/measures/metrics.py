"""The one request-metric table (AIPerf's tags, which are GenAI-Perf's names) and the per-level
summaries of results.json, computed only from raw records (so anyone can recompute them)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from trtkv.contracts.bench_doc import NOT_SENT, BenchLevel, RequestRecord
from trtkv.measures.stats import summarize


@dataclass(frozen=True)
class RequestMetric:
    """A per-request metric: AIPerf's display name, its unit, its value for one request (None: the
    request has none), and which way is better (AIPerf's --goodput thresholds)."""

    display: str
    unit: str
    value: Callable[[RequestRecord], float | None]
    larger_is_better: bool = False


def _ttst_ms(r: RequestRecord) -> float | None:
    idx = r.content_indices()
    return (r.response_ns[idx[1]] - r.response_ns[idx[0]]) / 1e6 if len(idx) > 1 else None


def _per_user(r: RequestRecord) -> float | None:
    itl = r.itl_ms()
    return 1000.0 / itl if itl else None


# tag -> metric, in the order of AIPerf's profile_export_aiperf.json
# (trtkv.bench.outputs.aiperf_export)
REQUEST_METRICS: dict[str, RequestMetric] = {
    "request_latency": RequestMetric("Request Latency", "ms", RequestRecord.request_latency_ms),
    "time_to_first_token": RequestMetric("Time to First Token", "ms", RequestRecord.ttft_ms),
    "time_to_second_token": RequestMetric("Time to Second Token", "ms", _ttst_ms),
    "inter_token_latency": RequestMetric("Inter Token Latency", "ms", RequestRecord.itl_ms),
    "output_token_throughput_per_user": RequestMetric(
        "Output Token Throughput Per User", "tokens/sec/user", _per_user, larger_is_better=True
    ),
    "output_sequence_length": RequestMetric(
        "Output Sequence Length", "tokens", lambda r: float(r.output_tokens())
    ),
    "input_sequence_length": RequestMetric(
        "Input Sequence Length", "tokens", lambda r: float(r.input_tokens)
    ),
}
# the request metrics a level of results.json summarizes, in its order (BenchLevel's fields)
LEVEL_METRICS = tuple(name for name in BenchLevel.model_fields if name in REQUEST_METRICS)
SYSTEM_METRICS = {"output_token_throughput": "tokens/sec", "request_throughput": "requests/sec"}


def summarize_level(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """One concurrency level (or rate): request metric stats over ok requests, system throughput,
    failure counts."""
    ok = [r for r in records if r.ok]
    out: dict[str, Any] = {}
    for name in LEVEL_METRICS:
        metric = REQUEST_METRICS[name]
        values = [v for v in (metric.value(r) for r in ok) if v is not None]
        out[name] = {"unit": metric.unit, **summarize(values)}
    duration_s = measured_duration_s(records)
    tokens = sum(r.output_tokens() for r in ok)
    out["output_token_throughput"] = {
        "unit": "tokens/sec",
        "avg": tokens / duration_s if duration_s else 0.0,
    }
    out["request_throughput"] = {
        "unit": "requests/sec",
        "avg": len(ok) / duration_s if duration_s else 0.0,
    }
    statuses: dict[str, int] = {}
    for r in records:
        statuses[r.status] = statuses.get(r.status, 0) + 1
    out["request_count"] = {
        "total": len(records),
        "ok": len(ok),
        "failed": len(records) - len(ok),
        **statuses,
        # open loop: sent later than scheduled, no worker free (trtkv.bench.load.loadgen.run_rate)
        "delayed": sum(r.delayed for r in records),
    }
    out["benchmark_duration"] = {"unit": "sec", "avg": duration_s}
    cpu_ns = sum(r.client_cpu_ns for r in ok)
    # the client's own CPU per streamed token (protocols whose sessions measure it)
    if cpu_ns and tokens:
        out["client_cpu_per_token"] = {"unit": "us", "avg": cpu_ns / tokens / 1e3}
    return out


def measured_duration_s(records: Sequence[RequestRecord]) -> float:
    """From the first send to the last response (or failure) of the level's measured requests."""
    records = [r for r in records if r.status != NOT_SENT]
    if not records:
        return 0.0
    start = min(r.send_ns for r in records)
    ends = [
        r.end_ns if r.end_ns is not None else (r.response_ns[-1] if r.response_ns else r.send_ns)
        for r in records
    ]
    return max(0.0, (max(ends) - start) / 1e9)
