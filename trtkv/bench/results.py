"""Result files (results.json, results.csv, requests.csv, results.md) and the one-screen console summary."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

from trtkv.bench.metrics import REQUEST_METRICS, SYSTEM_METRICS
from trtkv.bench.stats import STATS

TOKEN_COUNTING = (
    "Output tokens are counted by tokenizing each streamed response's text with the model's own tokenizer "
    "(no special tokens); a request's output_sequence_length is the sum over its responses. The ensemble's only "
    "output is text_output (the TensorRT-LLM backend interface has no per-response token count), so this is what "
    "GenAI-Perf does too. trtkv's reference model sends one response per token and holds back partial UTF-8 "
    "characters, so each response decodes on its own; `token_count_check` reports how often the per-response sum "
    "equals the token count of the whole output text. inter_token_latency per request = (last content response - "
    "first content response) / tokens after the first response, i.e. each gap divided by the tokens of the later "
    "response, token-weighted."
)


def _num(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def _clean(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clean(v) for v in obj]
    return _num(obj)


def write_json(path: Path, results: dict[str, Any]) -> None:
    path.write_text(json.dumps(_clean(results), indent=1, allow_nan=False) + "\n")


def write_csv(path: Path, results: dict[str, Any]) -> None:
    """One row per (level, metric) with GenAI-Perf's stats, then one row per accuracy figure."""
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["level", "metric", "unit", *STATS, "count"])
        for level, summary in results.get("levels", {}).items():
            for name in REQUEST_METRICS:
                m = summary[name]
                w.writerow([level, name, m["unit"], *(_fmt_csv(m.get(s)) for s in STATS), m.get("count")])
            for name in SYSTEM_METRICS:
                m = summary[name]
                w.writerow([level, name, m["unit"], _fmt_csv(m["avg"]), *[""] * (len(STATS) - 1), ""])
            counts = summary["request_count"]
            w.writerow([level, "failed_requests", "requests", counts["failed"], *[""] * (len(STATS) - 1), counts["total"]])
        for task, acc in results.get("accuracy", {}).items():
            for stat in ("accuracy", "agreement", "exact_match"):
                if stat in acc:
                    w.writerow([task, f"{task}.{stat}", "fraction", _fmt_csv(acc[stat]), *[""] * (len(STATS) - 1),
                                acc.get("total")])
                    ci = acc.get(f"{stat}_ci")
                    if isinstance(ci, list) and len(ci) == 2:
                        for end, value in zip(("ci_low", "ci_high"), ci, strict=True):
                            w.writerow([task, f"{task}.{stat}.{end}", "fraction", _fmt_csv(value),
                                        *[""] * (len(STATS) - 1), acc.get("total")])


def write_requests_csv(path: Path, records: list[dict[str, Any]]) -> None:
    """Every request, one row: the figures each metric is computed from."""
    cols = ["request_id", "phase", "level", "status", "error", "input_tokens", "max_tokens", "output_tokens",
            "send_time_ms", "first_token_time_ms", "end_time_ms", "responses"]
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(cols)
        for r in records:
            w.writerow([r["request_id"], r["phase"], r["level"], r["status"], r["error"], r["input_tokens"],
                        r["max_tokens"], r["output_tokens"], _fmt_csv(r["send_time_ms"]),
                        _fmt_csv(r["first_token_time_ms"]), _fmt_csv(r["end_time_ms"]), len(r["response_times_ms"])])


def _fmt_csv(value: Any) -> Any:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return round(value, 4) if isinstance(value, float) else value


def _f(value: Any, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


LEVEL_COLUMNS = [
    ("TTFT avg", "time_to_first_token", "avg"), ("TTFT p99", "time_to_first_token", "p99"),
    ("ITL avg", "inter_token_latency", "avg"), ("ITL p99", "inter_token_latency", "p99"),
    ("latency avg", "request_latency", "avg"), ("latency p99", "request_latency", "p99"),
    ("ISL", "input_sequence_length", "avg"), ("OSL", "output_sequence_length", "avg"),
    ("tok/s", "output_token_throughput", "avg"), ("req/s", "request_throughput", "avg"),
]


def level_rows(results: dict[str, Any]) -> list[list[str]]:
    rows = []
    for level, s in results.get("levels", {}).items():
        counts = s["request_count"]
        rows.append([level, *(_f(s[m].get(st), 2 if m.endswith("throughput") else 1) for _, m, st in LEVEL_COLUMNS),
                     f"{counts['failed']}/{counts['total']}"])
    return rows


CLIENT_NOTE = ("The client's own cost over each level's measured phase: its processes (the streams are sharded over "
               "several when one would use more than half a core), their CPU time per streamed token and share of a "
               "core, and its lag: how long bytes the kernel had already received waited for the client to read "
               "them (Linux stamps; the client's timestamps carry that lag, the server's latency does not).")


def client_rows(results: dict[str, Any]) -> list[list[str]]:
    rows = []
    for level, s in results.get("levels", {}).items():
        c = s.get("client")
        if not isinstance(c, dict):
            continue
        lag = c.get("lag_ms") or {}
        rows.append([level, str(c.get("workers")), _f(c.get("cpu_cores"), 2), _f(c.get("cpu_us_per_token")),
                     _f(lag.get("p50"), 2), _f(lag.get("p99"), 2), str(c.get("decided", "")),
                     str(c.get("warning", ""))])
    return rows


def interval_text(ci: Any) -> str:
    """"[lo, hi]" of a stored interval, "—" when there is none (results written before intervals existed)."""
    if not isinstance(ci, (list, tuple)) or len(ci) != 2 or any(not isinstance(x, (int, float)) for x in ci):
        return "—"
    return f"[{ci[0]:.3f}, {ci[1]:.3f}]"


def accuracy_rows(results: dict[str, Any]) -> list[list[str]]:
    rows = []
    for task, acc in results.get("accuracy", {}).items():
        if "error" in acc:
            rows.append([task, "—", "—", "—", f"not run: {acc['error']}"])
            continue
        main = "agreement" if task == "golden" else "accuracy"
        if task == "golden":
            extra = f"exact match {acc['exact_match']:.2f} {interval_text(acc.get('exact_match_ci'))}"
        else:
            extra = f"{acc['correct']}/{acc['total']} correct"
        if task == "needle":
            cis = acc.get("by_context_length_ci", {})
            extra += "; by context: " + ", ".join(f"{k}: {v:.2f} {interval_text(cis.get(k))}"
                                                  for k, v in acc.get("by_context_length", {}).items())
        rows.append([task, f"{task}.{main}", f"{acc[main]:.3f}", interval_text(acc.get(f"{main}_ci")),
                     f"{extra}; failed requests {acc['failed']}"])
    return rows


def slo_rows(results: dict[str, Any], failed_only: bool = False) -> list[list[str]]:
    rows = []
    for r in results.get("slo", {}).get("results", []):
        if failed_only and r["passed"]:
            continue
        measured = "not measured" if r["measured"] is None else f"{r['measured']:.4g}"
        rows.append([r["slo"], r["source"], r["where"], measured, "pass" if r["passed"] else "FAIL"])
    return rows


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_md(path: Path, results: dict[str, Any], plots: list[str]) -> None:
    ep, wl = results["endpoint"], results["workload"]
    parts = [f"# trtkv bench: {results['recipe']}", ""]
    if results.get("partial"):
        parts += [f"**Partial results**: the run was interrupted ({results.get('interrupted_during')}).", ""]
    parts += [f"- endpoint: `{ep['protocol']}://{ep['url']}` model `{ep['model']}` (URL from {ep['source']})",
              f"- started {results['started_at']}, {results['wall_seconds']:.1f} s",
              f"- workload: {wl['input_tokens']} input tokens (exact, cut from the evaluation text), max_tokens "
              f"{wl['output_tokens']}, {wl['num_requests']} measured requests per level after {wl['warmup_requests']} "
              f"warm-up (excluded), {wl['mode']}",
              f"- KV cache: {results.get('kv_cache', '?')}; times in ms, throughput per second", ""]
    if results.get("levels"):
        header = ["level", *(c for c, _, _ in LEVEL_COLUMNS), "failed"]
        parts += ["## Latency and throughput (GenAI-Perf metric names)", "", _md_table(header, level_rows(results)), ""]
        parts += ["Full statistics (avg, min, max, std, p50, p90, p95, p99) per metric and level: `results.csv` and "
                  "`results.json`; every request's raw record: `results.json` (`records`) and `requests.csv`.", ""]
    if client_rows(results):
        header = ["level", "processes", "CPU cores", "CPU us/token", "lag p50 ms", "lag p99 ms", "why", "warning"]
        parts += ["## The client", "", _md_table(header, client_rows(results)), "", CLIENT_NOTE, ""]
    if results.get("sweep"):
        parts += ["## Against input length (`--sweep-input`)", "", _md_table(
            list(SWEEP_COLUMNS), sweep_rows(results)),
            "", "Each length's median over its requests; `trtkv compare` of two recipes gives the break-even length.", ""]
    if results.get("accuracy"):
        header = ["task", "metric", "value", "95% interval", "details"]
        parts += ["## Accuracy", "", _md_table(header, accuracy_rows(results)), ""]
        parts += ["Intervals: Wilson for proportions, a seeded bootstrap over prompts for golden agreement. Two "
                  "recipes differ only where their intervals do not overlap (`trtkv compare`).", ""]
        for task, acc in results["accuracy"].items():
            for note in acc.get("notes", []):
                parts.append(f"- {task}: {note}")
        parts.append("")
    slo = results.get("slo", {})
    if slo.get("results"):
        verdict = "all passed" if slo["passed"] else "FAILED"
        parts += [f"## SLOs: {verdict}", "", _md_table(["slo", "from", "where", "measured", "result"], slo_rows(results)), ""]
    check = results.get("token_count_check")
    parts += ["## How tokens are counted", "", TOKEN_COUNTING, ""]
    if check:
        parts += [f"token_count_check: {check['equal']}/{check['requests']} requests' per-response sums equal the "
                  f"whole text's token count (max difference {check['max_abs_diff']}).", ""]
    if plots:
        parts += ["## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    path.write_text("\n".join(parts))


# what a client sees when the server is gone (connection refused/reset, stream closed, unavailable)
GONE_WORDS = ("refused", "reset", "unavailable", "broken pipe", "remote end closed", "connection aborted",
              "socket closed", "eof", "not reachable", "failed to connect")


def failure_summary(results: dict[str, Any]) -> str | None:
    """One line about failed requests (None when every request succeeded): how many, the first error, and whether
    the errors say the server went away."""
    records = results.get("records") or []
    failed = [r for r in records if r.get("status") not in ("ok", "cancelled", "not_sent")]
    if not failed:
        return None
    errors = [str(r.get("error") or r.get("status")) for r in failed]
    gone = sum(any(w in e.lower() for w in GONE_WORDS) for e in errors)
    text = f"{len(failed)} of {len(records)} requests failed (first: {errors[0][:160]})"
    if gone:
        ep = results.get("endpoint", {})
        text += (f"; {gone} of them could not reach the server: the server at {ep.get('protocol')}://{ep.get('url')} "
                 f"went away (check `trtkv status RECIPE` and its log)")
    return text


SWEEP_COLUMNS = ("level", "input tokens", "ITL p50", "TTFT p50", "ITL fit (ms/token x input + ms)", "client")


def sweep_rows(results: dict[str, Any]) -> list[list[str]]:
    """One row per (level, input length) of the input sweep, the level's ITL fit on its first row."""
    rows = []
    for level, body in (results.get("sweep") or {}).get("levels", {}).items():
        fit = body.get("itl_fit")
        ttft = dict(zip(body.get("ttft_input_tokens", []), body.get("ttft_p50_ms", []), strict=False))
        clients = body.get("client") or {}
        for i, (n, itl) in enumerate(zip(body.get("input_tokens", []), body.get("itl_p50_ms", []), strict=False)):
            fit_text = f"{fit['slope']:.3g} x input + {fit['intercept']:.3g}" if fit and i == 0 else ""
            t = ttft.get(n)
            c = clients.get(f"{n:.0f}") or {}
            client = f"{c['workers']} process(es)" + (f"; {c['warning']}" if c.get("warning") else "") if c else "—"
            rows.append([level if i == 0 else "", f"{n:,.0f}", f"{itl:.2f}", f"{t:.1f}" if t is not None else "—",
                         fit_text, client])
    return rows


def console_summary(results: dict[str, Any], out_dir: Path | None) -> None:
    """One screen: per-level table, accuracy, SLO verdict and where the files are."""
    from rich.console import Console
    from rich.table import Table

    con = Console()
    if not con.is_terminal:
        con = Console(width=160)
    ep = results["endpoint"]
    title = f"trtkv bench {results['recipe']} @ {ep['protocol']}://{ep['url']} ({ep['model']})"
    if results.get("levels"):
        table = Table(title=title + " — ms, tokens, per second", show_lines=False)
        for col in ["level", *(c for c, _, _ in LEVEL_COLUMNS), "failed"]:
            table.add_column(col, justify="right" if col != "level" else "left")
        for row in level_rows(results):
            table.add_row(*row)
        con.print(table)
    if results.get("sweep"):
        table = Table(title="against input length (--sweep-input): medians, ms")
        for col in SWEEP_COLUMNS:
            table.add_column(col)
        for row in sweep_rows(results):
            table.add_row(*row)
        con.print(table)
    if results.get("accuracy"):
        table = Table(title="accuracy")
        for col in ("task", "metric", "value", "95% interval", "details"):
            table.add_column(col)
        for row in accuracy_rows(results):
            table.add_row(*row)
        con.print(table)
    for level, s in results.get("levels", {}).items():
        client = s.get("client") or {}
        if client.get("workers", 1) > 1 or client.get("warning"):
            con.print(f"{level}: {client.get('workers')} client processes ({client.get('decided')}), "
                      f"{_f(client.get('cpu_us_per_token'))} us of client CPU per token")
        if client.get("warning"):
            con.print(f"[yellow]{level}: {client['warning']}[/yellow]")
    gone = failure_summary(results)
    if gone:
        con.print(f"[red]{gone}[/red]")
    slo = results.get("slo", {})
    failed = slo_rows(results, failed_only=True)
    if failed:
        table = Table(title="SLO breaches", style="red")
        for col in ("slo", "from", "where", "measured", "result"):
            table.add_column(col)
        for row in failed:
            table.add_row(*row)
        con.print(table)
    elif slo.get("results"):
        con.print(f"SLOs: all {len(slo['results'])} checks passed")
    pool = results.get("kv_pool") or {}
    if pool.get("served_bytes_per_gpu") is not None and pool.get("planned_bytes_per_gpu"):
        con.print(f"KV pool per GPU: planned {pool['planned_bytes_per_gpu'] / 2**30:.2f} GiB, served "
                  f"{pool['served_bytes_per_gpu'] / 2**30:.2f} GiB ({pool.get('source')})")
    for warning in results.get("warnings", []):
        con.print(f"[yellow]warning: {warning}[/yellow]")
    if results.get("partial"):
        con.print(f"[yellow]interrupted during {results.get('interrupted_during')}: partial results written[/yellow]")
    if out_dir is not None:
        con.print(f"results: {out_dir}/results.json, results.csv, results.md, *.png")
