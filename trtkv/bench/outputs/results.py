"""The result tables (per level, client, input sweep, accuracy, SLOs), the failed-requests line and
the one-screen console summary; the files (results.json, results.csv, requests.csv, results.md) are
trtkv.bench.outputs.results_files'."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from trtkv.contracts import CANCELLED, NOT_SENT, OK, BenchResults
from trtkv.measures.stats import interval_text

TOKEN_COUNTING = (
    "Output tokens are counted by tokenizing each streamed response's text with the model's own "
    "tokenizer (no special tokens); a request's output_sequence_length is the sum over its "
    "responses. The ensemble's only output is text_output (the TensorRT-LLM backend interface has "
    "no per-response token count), so this is what GenAI-Perf does too. trtkv's reference model "
    "sends one response per token and holds back partial UTF-8 characters, so each response "
    "decodes on its own; `token_count_check` reports how often the per-response sum equals the "
    "token count of the whole output text. inter_token_latency per request = (last content "
    "response - first content response) / tokens after the first response, i.e. each gap divided "
    "by the tokens of the later response, token-weighted."
)


def _f(value: Any, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


LEVEL_COLUMNS = [
    ("TTFT avg", "time_to_first_token", "avg"),
    ("TTFT p99", "time_to_first_token", "p99"),
    ("ITL avg", "inter_token_latency", "avg"),
    ("ITL p99", "inter_token_latency", "p99"),
    ("latency avg", "request_latency", "avg"),
    ("latency p99", "request_latency", "p99"),
    ("ISL", "input_sequence_length", "avg"),
    ("OSL", "output_sequence_length", "avg"),
    ("tok/s", "output_token_throughput", "avg"),
    ("req/s", "request_throughput", "avg"),
]


def level_rows(results: BenchResults) -> list[list[str]]:
    rows = []
    for level, s in results.levels.items():
        counts = s.request_count
        rows.append(
            [
                level,
                *(
                    _f(getattr(getattr(s, m), st, None), 2 if m.endswith("throughput") else 1)
                    for _, m, st in LEVEL_COLUMNS
                ),
                f"{counts['failed']}/{counts['total']}",
            ]
        )
    return rows


def client_rows(results: BenchResults) -> list[list[str]]:
    rows = []
    for level, s in results.levels.items():
        if (c := s.client) is None:
            continue
        lag = c.lag_ms
        rows.append(
            [
                level,
                str(c.workers),
                _f(c.cpu_cores, 2),
                _f(c.cpu_us_per_token),
                _f(lag and lag.p50, 2),
                _f(lag and lag.p99, 2),
                c.decided,
                c.warning or "",
            ]
        )
    return rows


def accuracy_rows(results: BenchResults) -> list[list[str]]:
    rows = []
    for task, acc in results.accuracy.items():
        if acc.error is not None:
            rows.append([task, "—", "—", "—", f"not run: {acc.error}"])
            continue
        main = "agreement" if task == "golden" else "accuracy"
        if task == "golden":
            extra = f"exact match {acc.exact_match:.2f} {interval_text(acc.exact_match_ci)}"
        else:
            extra = f"{acc.correct}/{acc.total} correct"
        if task == "needle":
            cis = acc.by_context_length_ci or {}
            extra += "; by context: " + ", ".join(
                f"{k}: {v:.2f} {interval_text(cis.get(k))}"
                for k, v in (acc.by_context_length or {}).items()
            )
        rows.append(
            [
                task,
                f"{task}.{main}",
                f"{getattr(acc, main):.3f}",
                interval_text(getattr(acc, f"{main}_ci")),
                f"{extra}; failed requests {acc.failed}",
            ]
        )
    return rows


def slo_rows(results: BenchResults, failed_only: bool = False) -> list[list[str]]:
    rows = []
    for r in results.slo.results if results.slo else []:
        if failed_only and r.passed:
            continue
        measured = "not measured" if r.measured is None else f"{r.measured:.4g}"
        rows.append([r.slo, r.source, r.where, measured, "pass" if r.passed else "FAIL"])
    return rows


# what a client sees when the server is gone (connection refused/reset, stream closed, unavailable)
GONE_WORDS = (
    "refused",
    "reset",
    "unavailable",
    "broken pipe",
    "remote end closed",
    "connection aborted",
    "socket closed",
    "eof",
    "not reachable",
    "failed to connect",
)


def failure_summary(results: BenchResults) -> str | None:
    """One line about failed requests (None when every request succeeded): how many, the first
    error, and whether the errors say the server went away."""
    records = results.records
    failed = [r for r in records if r.status not in (OK, CANCELLED, NOT_SENT)]
    if not failed:
        return None
    errors = [r.error or r.status for r in failed]
    gone = sum(any(w in e.lower() for w in GONE_WORDS) for e in errors)
    text = f"{len(failed)} of {len(records)} requests failed (first: {errors[0][:160]})"
    if gone and (ep := results.endpoint):
        text += (
            f"; {gone} of them could not reach the server: the server at "
            f"{ep.protocol}://{ep.url} went away (check `trtkv status RECIPE` and its log)"
        )
    return text


SWEEP_COLUMNS = (
    "level",
    "input tokens",
    "ITL p50",
    "TTFT p50",
    "ITL fit (ms/token x input + ms)",
    "client",
)


def sweep_rows(results: BenchResults) -> list[list[str]]:
    """One row per (level, input length) of the input sweep, the level's ITL fit on its first
    row."""
    rows = []
    for level, body in (results.sweep.levels if results.sweep else {}).items():
        fit = body.itl_fit
        ttft = dict(zip(body.ttft_input_tokens, body.ttft_p50_ms, strict=False))
        for i, (n, itl) in enumerate(zip(body.input_tokens, body.itl_p50_ms, strict=False)):
            fit_text = (
                f"{fit['slope']:.3g} x input + {fit['intercept']:.3g}" if fit and i == 0 else ""
            )
            t = ttft.get(n)
            c = body.client.get(f"{n:.0f}")
            client = (
                f"{c.workers} process(es)" + (f"; {c.warning}" if c.warning else "") if c else "—"
            )
            rows.append(
                [
                    level if i == 0 else "",
                    f"{n:,.0f}",
                    f"{itl:.2f}",
                    f"{t:.1f}" if t is not None else "—",
                    fit_text,
                    client,
                ]
            )
    return rows


def prefix_lines(results: BenchResults) -> list[str]:
    """bench.prefix's levels: the server's hit rate per tier against the plan's, the difference
    and the plan's routing assumption, and the TTFT median per turn."""
    out = []
    for label, level in (results.prefix or {}).items():
        ttft = ", ".join(f"turn {t} {ms:,.1f}" for t, ms in level.ttft_ms_p50_per_turn.items())
        out.append(
            f"prefix cache {label}: hit rate {level.against_plan_text()}; TTFT p50 ms {ttft or '-'}"
        )
    return out


def console_summary(results: BenchResults, out_dir: Path | None) -> None:
    """One screen: per-level table, accuracy, SLO verdict and where the files are."""
    from rich.console import Console
    from rich.table import Table

    con = Console()
    if not con.is_terminal:
        con = Console(width=160)
    ep = results.endpoint
    where = f"{ep.protocol}://{ep.url} ({ep.model})" if ep else "?"
    title = f"trtkv bench {results.recipe} @ {where}"
    if results.levels:
        table = Table(title=title + " — ms, tokens, per second", show_lines=False)
        for col in ["level", *(c for c, _, _ in LEVEL_COLUMNS), "failed"]:
            table.add_column(col, justify="right" if col != "level" else "left")
        for row in level_rows(results):
            table.add_row(*row)
        con.print(table)
    for line in prefix_lines(results):
        con.print(line)
    if results.sweep:
        table = Table(title="against input length (--sweep-input): medians, ms")
        for col in SWEEP_COLUMNS:
            table.add_column(col)
        for row in sweep_rows(results):
            table.add_row(*row)
        con.print(table)
    if results.accuracy:
        table = Table(title="accuracy")
        for col in ("task", "metric", "value", "95% interval", "details"):
            table.add_column(col)
        for row in accuracy_rows(results):
            table.add_row(*row)
        con.print(table)
    for level, s in results.levels.items():
        if (client := s.client) and (client.workers > 1 or client.warning):
            con.print(
                f"{level}: {client.workers} client processes ({client.decided}), "
                f"{_f(client.cpu_us_per_token)} us of client CPU per token"
            )
        if client and client.warning:
            con.print(f"[yellow]{level}: {client.warning}[/yellow]")
    gone = failure_summary(results)
    if gone:
        con.print(f"[red]{gone}[/red]")
    failed = slo_rows(results, failed_only=True)
    if failed:
        table = Table(title="SLO breaches", style="red")
        for col in ("slo", "from", "where", "measured", "result"):
            table.add_column(col)
        for row in failed:
            table.add_row(*row)
        con.print(table)
    elif results.slo and results.slo.results:
        con.print(f"SLOs: all {len(results.slo.results)} checks passed")
    pool = results.kv_pool
    if pool and pool.served_bytes_per_gpu is not None and pool.planned_bytes_per_gpu:
        con.print(
            f"KV pool per GPU: planned {pool.planned_bytes_per_gpu / 2**30:.2f} GiB, served "
            f"{pool.served_bytes_per_gpu / 2**30:.2f} GiB ({pool.source})"
        )
    for warning in results.warnings:
        con.print(f"[yellow]warning: {warning}[/yellow]")
    for level, s in results.levels.items():
        if delayed := s.request_count.get("delayed"):
            con.print(
                f"[yellow]{level}: {delayed} of {s.request_count['total']} requests were sent "
                "late (every worker busy at their time: the server or the client could not keep "
                "the rate)[/yellow]"
            )
    if results.partial:
        con.print(
            f"[yellow]interrupted during {results.interrupted_during}: partial results "
            "written beside the last complete run's (kept: only a complete run replaces "
            "them)[/yellow]"
        )
    if out_dir is not None:
        con.print(f"results: {out_dir}/results.json, results.csv, results.md, *.png")
