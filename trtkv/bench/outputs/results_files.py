"""The result files of a bench run: results.json (NaN written as null), results.csv (GenAI-Perf's
stats per level and metric, then the accuracy figures), requests.csv (one row per request) and
results.md (the tables of trtkv.bench.outputs.results, the SLO verdicts, how tokens are counted and
the plots)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

from trtkv.bench.outputs.results import (
    LEVEL_COLUMNS,
    SWEEP_COLUMNS,
    TOKEN_COUNTING,
    accuracy_rows,
    client_rows,
    level_rows,
    slo_rows,
    sweep_rows,
)
from trtkv.contracts.bench_doc import BenchResults, RequestRecordDoc
from trtkv.measures.metrics import LEVEL_METRICS, SYSTEM_METRICS
from trtkv.measures.stats import STATS


def _clean(obj: Any) -> Any:
    """`obj` with every NaN as None (JSON null)."""
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clean(v) for v in obj]
    return None if isinstance(obj, float) and math.isnan(obj) else obj


def write_json(path: Path, results: BenchResults) -> None:
    path.write_text(json.dumps(_clean(results.document()), indent=1, allow_nan=False) + "\n")


def write_csv(path: Path, results: BenchResults) -> None:
    """One row per (level, metric) with GenAI-Perf's stats, then one row per accuracy figure."""
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["level", "metric", "unit", *STATS, "count"])
        for level, summary in results.levels.items():
            for name in LEVEL_METRICS:
                m = getattr(summary, name)
                w.writerow(
                    [level, name, m.unit, *(_fmt_csv(getattr(m, s)) for s in STATS), m.count]
                )
            for name in SYSTEM_METRICS:
                m = getattr(summary, name)
                w.writerow(_one_figure(level, name, m.unit, m.avg, ""))
            counts = summary.request_count
            w.writerow(
                _one_figure(level, "failed_requests", "requests", counts["failed"], counts["total"])
            )
        for task, acc in results.accuracy.items():
            for stat in ("accuracy", "agreement", "exact_match"):
                if (value := getattr(acc, stat)) is not None:
                    total = acc.total
                    w.writerow(_one_figure(task, f"{task}.{stat}", "fraction", value, total))
                    ci = getattr(acc, f"{stat}_ci")
                    if isinstance(ci, list) and len(ci) == 2:
                        for end, value in zip(("ci_low", "ci_high"), ci, strict=True):
                            metric = f"{task}.{stat}.{end}"
                            w.writerow(_one_figure(task, metric, "fraction", value, total))


def _one_figure(level: str, metric: str, unit: str, value: Any, count: Any) -> list[Any]:
    """A results.csv row with one figure, in the first stat's column."""
    return [level, metric, unit, _fmt_csv(value), *[""] * (len(STATS) - 1), count]


def write_requests_csv(path: Path, records: list[RequestRecordDoc]) -> None:
    """Every request, one row: the figures each metric is computed from (the record's own fields,
    then its count of responses)."""
    cols = [
        "request_id",
        "phase",
        "level",
        "status",
        "error",
        "input_tokens",
        "max_tokens",
        "output_tokens",
        "send_time_ms",
        "first_token_time_ms",
        "end_time_ms",
    ]
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow([*cols, "responses"])
        for r in records:
            cells = (_fmt_csv(getattr(r, c)) if c.endswith("_ms") else getattr(r, c) for c in cols)
            w.writerow([*cells, len(r.response_times_ms)])


def _fmt_csv(value: Any) -> Any:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return round(value, 4) if isinstance(value, float) else value


CLIENT_NOTE = (
    "The client's own cost over each level's measured phase: its processes (the streams are "
    "sharded over several when one would use more than half a core), their CPU time per streamed "
    "token and share of a core, and its lag: how long bytes the kernel had already received waited "
    "for the client to read them (Linux stamps; the client's timestamps carry that lag, the "
    "server's latency does not)."
)


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += [
        "| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in row) + " |"
        for row in rows
    ]
    return "\n".join(lines)


def write_md(path: Path, results: BenchResults, plots: list[str]) -> None:
    ep, wl = results.endpoint, results.workload
    if ep is None or wl is None:
        raise ValueError("results.md needs the endpoint and workload (runner.assemble sets both)")
    parts = [f"# trtkv bench: {results.recipe}", ""]
    if results.partial:
        parts += [
            f"**Partial results**: the run was interrupted ({results.interrupted_during}).",
            "",
        ]
    parts += [
        f"- endpoint: `{ep.protocol}://{ep.url}` model `{ep.model}` (URL from {ep.source})",
        f"- started {results.started_at}, {results.wall_seconds:.1f} s",
        f"- workload: {wl.input_tokens} input tokens (exact, cut from the evaluation text), "
        f"max_tokens {wl.output_tokens}, {wl.num_requests} measured requests per level after "
        f"{wl.warmup_requests} warm-up (excluded), {wl.mode}",
        f"- KV cache: {results.kv_cache or '?'}; times in ms, throughput per second",
        "",
    ]
    if results.levels:
        header = ["level", *(c for c, _, _ in LEVEL_COLUMNS), "failed"]
        parts += [
            "## Latency and throughput (GenAI-Perf metric names)",
            "",
            _md_table(header, level_rows(results)),
            "",
        ]
        parts += [
            "Full statistics (avg, min, max, std, p50, p90, p95, p99) per metric and level: "
            "`results.csv` and `results.json`; every request's raw record: `results.json` "
            "(`records`) and `requests.csv`.",
            "",
        ]
    if client_rows(results):
        header = [
            "level",
            "processes",
            "CPU cores",
            "CPU us/token",
            "lag p50 ms",
            "lag p99 ms",
            "why",
            "warning",
        ]
        parts += ["## The client", "", _md_table(header, client_rows(results)), "", CLIENT_NOTE, ""]
    if results.sweep:
        parts += [
            "## Against input length (`--sweep-input`)",
            "",
            _md_table(list(SWEEP_COLUMNS), sweep_rows(results)),
            "",
            "Each length's median over its requests; `trtkv compare` of two recipes gives the "
            "break-even length.",
            "",
        ]
    if results.accuracy:
        header = ["task", "metric", "value", "95% interval", "details"]
        parts += ["## Accuracy", "", _md_table(header, accuracy_rows(results)), ""]
        parts += [
            "Intervals: Wilson for proportions, a seeded bootstrap over prompts for golden "
            "agreement. Two recipes differ only where their intervals do not overlap (`trtkv "
            "compare`).",
            "",
        ]
        for task, acc in results.accuracy.items():
            for note in acc.notes:
                parts.append(f"- {task}: {note}")
        parts.append("")
    if (slo := results.slo) and slo.results:
        verdict = "all passed" if slo.passed else "FAILED"
        parts += [
            f"## SLOs: {verdict}",
            "",
            _md_table(["slo", "from", "where", "measured", "result"], slo_rows(results)),
            "",
        ]
    check = results.token_count_check
    parts += ["## How tokens are counted", "", TOKEN_COUNTING, ""]
    if check:
        parts += [
            f"token_count_check: {check['equal']}/{check['requests']} requests' per-response sums "
            f"equal the whole text's token count (max difference {check['max_abs_diff']}).",
            "",
        ]
    if plots:
        parts += ["## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    path.write_text("\n".join(parts))
