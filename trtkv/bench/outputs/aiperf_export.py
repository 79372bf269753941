"""AIPerf-compatible exports of a bench level: `profile_export_aiperf.json` and
`profile_export_aiperf.csv` with AIPerf's metric tags, display names, units and statistic keys (as
aiperf 0.13.0 writes them, schema_version 1.4: read off a real AIPerf run against vLLM on this
project's machines), computed from trtkv's raw request records.

Per-request metrics carry {unit, avg, p1, p5, p10, p25, p50, p75, p90, p95, p99, min, max, std,
count, sum} (percentiles by linear interpolation, std the population one, as numpy computes them);
run metrics carry {unit, avg}. Goodput follows AIPerf's `--goodput "time_to_first_token:500
inter_token_latency:100"`: a request is good when every named metric is within its threshold (<= for
latencies, >= for per-user throughput); goodput = good requests per second of the level's duration.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trtkv.contracts.bench_doc import RequestRecord
from trtkv.core.errors import TrtkvError
from trtkv.measures.metrics import REQUEST_METRICS, measured_duration_s

SCHEMA_VERSION = "1.4"  # aiperf 0.13.0's profile_export_aiperf.json
PERCENTILES = (1, 5, 10, 25, 50, 75, 90, 95, 99)
CSV_STATS = ("avg", "min", "max", "sum", *(f"p{p}" for p in PERCENTILES), "std")


def parse_goodput(text: str | None) -> dict[str, float]:
    """`time_to_first_token:500 inter_token_latency:100` -> {tag: threshold}; a clear error naming
    the allowed tags."""
    out: dict[str, float] = {}
    for item in (text or "").replace(",", " ").split():
        tag, sep, value = item.partition(":")
        if not sep or tag not in REQUEST_METRICS:
            raise TrtkvError(
                f"--goodput {text!r}: {item!r} is not TAG:VALUE with a per-request metric tag. "
                f"Allowed: {', '.join(REQUEST_METRICS)} (AIPerf's tags; ms, tokens or "
                "tokens/sec/user)."
            )
        try:
            out[tag] = float(value)
        except ValueError:
            raise TrtkvError(f"--goodput {text!r}: {value!r} is not a number.") from None
    return out


def stats(values: Sequence[float], unit: str) -> dict[str, Any]:
    import numpy as np

    if not values:
        return {"unit": unit, "avg": None, "count": 0}
    arr = np.asarray(values, dtype=float)
    out: dict[str, Any] = {"unit": unit, "avg": float(arr.mean())}
    out.update({f"p{p}": float(np.percentile(arr, p)) for p in PERCENTILES})
    out.update(
        {
            "min": float(arr.min()),
            "max": float(arr.max()),
            "std": float(arr.std()),
            "count": int(arr.size),
            "sum": float(arr.sum()),
        }
    )
    return out


def is_good(record: RequestRecord, goodput: dict[str, float]) -> bool:
    for tag, threshold in goodput.items():
        metric = REQUEST_METRICS[tag]
        value = metric.value(record)
        if value is None or (value < threshold if metric.larger_is_better else value > threshold):
            return False
    return True


def level_export(
    records: Sequence[RequestRecord],
    goodput: dict[str, float] | None = None,
    meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """profile_export_aiperf.json's content for one level's measured records."""
    ok = [r for r in records if r.ok]
    duration = measured_duration_s(records)
    out: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "aiperf_version": None,
        "producer": "trtkv bench (AIPerf 0.13.0 export layout)",
    }
    tokens = sum(r.output_tokens() for r in ok)
    isl = sum(r.input_tokens for r in ok)
    failed = len(records) - len(ok)
    out["request_throughput"] = _run("requests/sec", len(ok), duration)
    for tag, metric in REQUEST_METRICS.items():
        out[tag] = stats([v for v in (metric.value(r) for r in ok) if v is not None], metric.unit)
    out["request_count"] = _run("requests", len(ok))
    out["error_request_count"] = _run("requests", failed)
    out["request_error_rate"] = _run("%", 100.0 * failed / max(1, len(records)))
    out["completed_request_count"] = _run("requests", len(records))
    out["output_token_throughput"] = _run("tokens/sec", tokens, duration)
    out["total_output_tokens"] = _run("tokens", tokens)
    out["total_osl"] = _run("tokens", tokens)
    out["total_isl"] = _run("tokens", isl)
    out["benchmark_duration"] = _run("sec", duration)
    if goodput:
        good = sum(is_good(r, goodput) for r in ok)
        out["good_request_count"] = _run("requests", good)
        out["goodput"] = _run("requests/sec", good, duration)
    out["error_summary"] = _error_summary(records)
    out.update(meta or {})
    return out


def _run(unit: str, value: float, per_s: float | None = None) -> dict[str, Any]:
    """A run metric ({unit, avg}): `value`, or `value` per second of `per_s` (0 when it is 0)."""
    if per_s is not None:
        value = value / per_s if per_s else 0.0
    return {"unit": unit, "avg": float(value)}


def _error_summary(records: Sequence[RequestRecord]) -> list[dict[str, Any]]:
    counts: dict[str, int] = {}
    for r in records:
        if not r.ok:
            key = (r.error or r.status)[:200]
            counts[key] = counts.get(key, 0) + 1
    return [
        {"error_details": {"message": k}, "count": n}
        for k, n in sorted(counts.items(), key=lambda kv: -kv[1])
    ]


def write_level(
    folder: Path,
    records: Sequence[RequestRecord],
    goodput: dict[str, float] | None = None,
    meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write profile_export_aiperf.json and .csv into `folder`; returns the JSON content."""
    folder.mkdir(parents=True, exist_ok=True)
    doc = level_export(records, goodput, meta)
    (folder / "profile_export_aiperf.json").write_text(json.dumps(doc, indent=2) + "\n")
    with (folder / "profile_export_aiperf.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["Metric", *CSV_STATS])
        for tag, metric in sorted(REQUEST_METRICS.items(), key=lambda kv: kv[1].display):
            s = doc[tag]
            if s.get("count"):
                w.writerow(
                    [f"{metric.display} ({metric.unit})", *(f"{s[k]:.2f}" for k in CSV_STATS)]
                )
        w.writerow([])
        w.writerow(["Metric", "Value"])
        for tag, name in (
            ("benchmark_duration", "Benchmark Duration"),
            ("goodput", "Goodput"),
            ("good_request_count", "Good Request Count"),
            ("output_token_throughput", "Output Token Throughput"),
            ("request_count", "Request Count"),
            ("request_error_rate", "Request Error Rate"),
            ("request_throughput", "Request Throughput"),
            ("total_isl", "Total Input Sequence Length"),
            ("total_osl", "Total Output Sequence Length"),
        ):
            if tag in doc:
                w.writerow([f"{name} ({doc[tag]['unit']})", f"{doc[tag]['avg']:.2f}"])
    return doc
