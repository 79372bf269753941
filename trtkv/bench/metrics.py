"""Per-level summaries in GenAI-Perf names, computed only from raw records (so anyone can recompute
them)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trtkv.bench.records import NOT_SENT, RequestRecord
from trtkv.bench.stats import summarize

REQUEST_METRICS = {
    "time_to_first_token": ("ms", RequestRecord.ttft_ms),
    "inter_token_latency": ("ms", RequestRecord.itl_ms),
    "request_latency": ("ms", RequestRecord.request_latency_ms),
    "output_sequence_length": ("tokens", lambda r: float(r.output_tokens())),
    "input_sequence_length": ("tokens", lambda r: float(r.input_tokens)),
}
SYSTEM_METRICS = {"output_token_throughput": "tokens/sec", "request_throughput": "requests/sec"}
METRIC_NAMES = (*REQUEST_METRICS, *SYSTEM_METRICS)


def summarize_level(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """One concurrency level (or rate): request metric stats over ok requests, system throughput,
    failure counts."""
    ok = [r for r in records if r.ok]
    out: dict[str, Any] = {}
    for name, (unit, fn) in REQUEST_METRICS.items():
        values = [v for v in (fn(r) for r in ok) if v is not None]
        out[name] = {"unit": unit, **summarize(values)}
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
        # open loop: sent later than scheduled, no worker free (trtkv.bench.loadgen.run_rate)
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
