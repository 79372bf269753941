"""Cross-check `trtkv bench` against perf_analyzer, and measure the client's own cost (`make bench-crosscheck`).

1. Side by side: the same endpoint, prompts (exact token counts), max_tokens and concurrency through trtkv's client
   and through perf_analyzer (tritonclient 2.51.0's binary, count_windows mode, gRPC streaming): request latency,
   time to first token and request throughput. Goal: within 10 %.
   Endpoints: the trivial model (benchmarks/trivial_repo, started here on free ports) and, when it is up, the real
   server of --recipe (engines/<recipe>/serve/server.json, or --url).
2. Client overhead per streamed token: CPU time of this process (all its threads: gRPC, callbacks) per response,
   against the trivial model with long streams; perf_analyzer's CPU time per response on the same workload for scale.
   Goal <= 50 us.
3. Highest sustainable request rate: open-loop constant-rate runs against the trivial model at rising rates; a rate
   is sustained when >= 95 % of it is achieved, nothing fails and the median latency stays < 4x the lowest-rate one.

Writes engines/bench-crosscheck/results.md and results.json (a results file, not a test).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from trtkv.bench.load.loadgen import Job, SessionPool, run_concurrency, run_rate
from trtkv.bench.load.prompts import count_tokens, latency_prompts, load_tokenizer, prompt_tokens, tokenizer_dir
from trtkv.bench.runner import resolve_endpoint
from trtkv.bench.transport.client import Endpoint, SamplingParams
from trtkv.bench.transport.endpoints import check_endpoint, session_factory
from trtkv.contracts.bench_doc import RequestRecord
from trtkv.core import paths
from trtkv.core.errors import TrtkvError
from trtkv.measures.metrics import summarize_level
from trtkv.recipe import load_recipe
from trtkv.serving import supervise

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: the dev-only helpers next to this script
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: tests/support's shared servers

import perf_analyzer as pa  # noqa: E402

from tests.support import localserver  # noqa: E402

TRIVIAL_REPO = Path(__file__).resolve().parent / "trivial_repo"


def jobs_for(prompts: list[str], tokenizer: Any, count: int, max_tokens: int, tag: str) -> list[Job]:
    out = []
    for i in range(count):
        p = prompts[i % len(prompts)]
        rec = RequestRecord(f"{tag}-{i}", "crosscheck", tag, i % len(prompts), prompt_tokens(tokenizer, p), max_tokens)
        out.append(Job(rec, p, SamplingParams(max_tokens=max_tokens)))
    return out


def trtkv_level(ep: Endpoint, prompts: list[str], tokenizer: Any, count: int, max_tokens: int, conc: int,
                timeout_s: float) -> dict[str, Any]:
    """A closed-loop level through trtkv's client (warm-up of `conc` requests first), with CPU seconds used."""
    pool = SessionPool(session_factory(ep), conc)  # the warm-up's connections carry the measured requests
    try:
        run_concurrency(pool, jobs_for(prompts, tokenizer, conc, max_tokens, "warm"), conc, timeout_s)
        jobs = jobs_for(prompts, tokenizer, count, max_tokens, f"c{conc}")
        cpu0 = time.process_time()
        recs = run_concurrency(pool, jobs, conc, timeout_s)
        cpu_s = time.process_time() - cpu0
    finally:
        pool.close()
    for r in recs:
        r.response_tokens = [count_tokens(tokenizer, t) for t in r.response_texts]
    return {"summary": summarize_level(recs), "cpu_seconds": cpu_s, "responses": sum(len(r.response_ns) for r in recs),
            "records": recs}


def side_by_side(name: str, ep: Endpoint, prompts: list[str], tokenizer: Any, max_tokens: int, levels: list[int],
                 trtkv_requests: int, pa_window: int, work: Path, timeout_s: float,
                 pa_trials: int = 10) -> list[dict[str, Any]]:
    data = pa.input_data(work / f"pa_input_{name}.json", prompts, max_tokens)
    rows = []
    for conc in levels:
        print(f"[{name}] concurrency {conc}: trtkv bench client ...", flush=True)
        mine = trtkv_level(ep, prompts, tokenizer, trtkv_requests, max_tokens, conc, timeout_s)
        print(f"[{name}] concurrency {conc}: perf_analyzer ...", flush=True)
        try:
            theirs = pa.run(ep.url, ep.model, data, conc, work, window_requests=pa_window, max_trials=pa_trials)
            pm = pa.export_metrics(theirs["export"])
            error = None
        except (TrtkvError, OSError) as exc:
            pm, error = None, str(exc).splitlines()[0]
        s = mine["summary"]
        row = {"endpoint": name, "concurrency": conc, "max_tokens": max_tokens,
               "input_tokens": prompt_tokens(tokenizer, prompts[0]),
               "trtkv": {"requests": s["request_count"]["ok"], "failed": s["request_count"]["failed"],
                         "request_latency_avg_ms": s["request_latency"]["avg"],
                         "request_latency_p50_ms": s["request_latency"]["p50"],
                         "time_to_first_token_avg_ms": s["time_to_first_token"]["avg"],
                         "request_throughput": s["request_throughput"]["avg"]},
               "perf_analyzer": None if pm is None else {
                   "requests": pm["requests"], "request_latency_avg_ms": pm["request_latency"]["avg"],
                   "request_latency_p50_ms": pm["request_latency"]["p50"],
                   "time_to_first_token_avg_ms": pm["time_to_first_token"]["avg"],
                   "request_throughput": pm["request_throughput"]},
               "perf_analyzer_error": error}
        if pm is not None:
            row["diff_pct"] = {k: 100.0 * (row["trtkv"][k] - row["perf_analyzer"][k]) / row["perf_analyzer"][k]
                               for k in ("request_latency_avg_ms", "time_to_first_token_avg_ms", "request_throughput")
                               if row["perf_analyzer"][k]}
        rows.append(row)
    return rows


def client_overhead(eps: dict[str, Endpoint], prompts: list[str], tokenizer: Any, work: Path, max_tokens: int = 512,
                    requests: int = 40) -> dict[str, Any]:
    """CPU microseconds per streamed response: trtkv's client per protocol (this process), perf_analyzer (its own)."""
    out: dict[str, Any] = {"max_tokens": max_tokens, "requests": requests, "trtkv": {}}
    for proto, ep in eps.items():
        mine = trtkv_level(ep, prompts, tokenizer, requests, max_tokens, 1, 60.0)
        out["trtkv"][proto] = {"responses": mine["responses"],
                               "cpu_us_per_response": 1e6 * mine["cpu_seconds"] / max(1, mine["responses"]),
                               "request_latency_avg_ms": mine["summary"]["request_latency"]["avg"]}
    data = pa.input_data(work / "pa_input_overhead.json", prompts[:4], max_tokens)
    try:
        theirs = pa.run(eps["grpc"].url, eps["grpc"].model, data, 1, work, window_requests=requests, stability_pct=90,
                        max_trials=4)
        responses = sum(len(r["response_timestamps"]) for e in theirs["export"]["experiments"] for r in e["requests"])
        out["perf_analyzer_cpu_us_per_response"] = 1e6 * theirs["cpu_seconds"] / max(1, responses)
        out["perf_analyzer_responses"] = responses
    except (TrtkvError, OSError) as exc:
        out["perf_analyzer_error"] = str(exc).splitlines()[0]
    return out


def max_rate(ep: Endpoint, prompts: list[str], tokenizer: Any, rates: list[float], seconds: float = 3.0,
             max_tokens: int = 16) -> dict[str, Any]:
    """Open-loop constant-rate steps; the highest rate that is sustained (see the module docstring)."""
    factory = session_factory(ep)
    steps, base_p50, best = [], None, None
    for rate in rates:
        n = max(20, int(rate * seconds))
        cpu0, wall0 = time.process_time(), time.perf_counter()
        recs = run_rate(factory, jobs_for(prompts, tokenizer, n, max_tokens, f"r{rate:g}"), rate, 30.0, max_inflight=64)
        cpu_frac = (time.process_time() - cpu0) / max(1e-9, time.perf_counter() - wall0)
        for r in recs:
            r.response_tokens = [count_tokens(tokenizer, t) for t in r.response_texts]
        s = summarize_level(recs)
        achieved, p50 = s["request_throughput"]["avg"], s["request_latency"]["p50"]
        base_p50 = p50 if base_p50 is None else base_p50
        ok = (achieved >= 0.95 * rate and s["request_count"]["failed"] == 0 and p50 < 4 * max(base_p50, 1.0))
        steps.append({"offered": rate, "achieved": achieved, "failed": s["request_count"]["failed"],
                      "request_latency_p50_ms": p50, "request_latency_p99_ms": s["request_latency"]["p99"],
                      "client_cpu_cores": cpu_frac, "sustained": ok})
        print(f"[rate] offered {rate:g}/s achieved {achieved:.1f}/s p50 {p50:.1f} ms client CPU {cpu_frac:.2f} "
              f"{'ok' if ok else 'NOT sustained'}", flush=True)
        if ok:
            best = rate
        else:
            break
    return {"max_tokens": max_tokens, "seconds_per_step": seconds, "steps": steps, "highest_sustained_rate": best}


def write(out_dir: Path, results: dict[str, Any], md: str | None = None) -> None:
    """results.json (replaced whole) and results.md (`md`, default this script's table) in `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".results.json.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(results, indent=1) + "\n")
    tmp.replace(out_dir / "results.json")
    (out_dir / "results.md").write_text(markdown(results) if md is None else md)


def finish(out_dir: Path, results: dict[str, Any], md: str, failed: bool) -> int:
    """Write and print a cross-check's results; its exit status (1 when any request failed)."""
    write(out_dir, results, md)
    print(md)
    print(f"wrote {out_dir / 'results.md'} and results.json")
    return 1 if failed else 0


def _pct(row: dict[str, Any], key: str) -> str:
    d = row.get("diff_pct", {}).get(key)
    return "—" if d is None else f"{d:+.1f}%"


def markdown(r: dict[str, Any]) -> str:
    lines = ["# trtkv bench cross-check", "", f"- run {r['started_at']} on {r['machine']}; perf_analyzer "
             f"{pa.VERSION} (count_windows, gRPC streaming, stats over its last 3 windows from --profile-export-file)",
             "- both tools: same endpoint, prompts (exact input tokens), max_tokens, concurrency; server and clients "
             "share the same CPU cores, so figures are noisy", "",
             "## Side by side (ms, requests/s; diff = trtkv vs perf_analyzer)", "",
             "| endpoint | conc | ISL/OSL | latency avg trtkv | latency avg PA | diff | TTFT avg trtkv | TTFT avg PA | diff "
             "| req/s trtkv | req/s PA | diff | within 10% |", "|" + "---|" * 13]
    for row in r["side_by_side"]:
        t, p = row["trtkv"], row["perf_analyzer"]
        if p is None:
            lines.append(f"| {row['endpoint']} | {row['concurrency']} | {row['input_tokens']}/{row['max_tokens']} | "
                         f"{t['request_latency_avg_ms']:.2f} | failed: {row['perf_analyzer_error']} |||||||||")
            continue
        within = all(abs(row["diff_pct"].get(k, 0)) <= 10 for k in ("request_latency_avg_ms", "request_throughput"))
        lines.append(f"| {row['endpoint']} | {row['concurrency']} | {row['input_tokens']}/{row['max_tokens']} | "
                     f"{t['request_latency_avg_ms']:.2f} | {p['request_latency_avg_ms']:.2f} | "
                     f"{_pct(row, 'request_latency_avg_ms')} | {t['time_to_first_token_avg_ms']:.2f} | "
                     f"{p['time_to_first_token_avg_ms']:.2f} | {_pct(row, 'time_to_first_token_avg_ms')} | "
                     f"{t['request_throughput']:.2f} | {p['request_throughput']:.2f} | "
                     f"{_pct(row, 'request_throughput')} | {'yes' if within else 'NO'} |")
    o = r.get("client_overhead")
    if o:
        lines += ["", "## Client overhead per streamed token (trivial model, concurrency 1)", "",
                  f"CPU time of the benchmark process (all threads) per streamed response, {o['max_tokens']} responses "
                  f"per request; goal <= 50 µs.", "", "| client | responses | CPU µs per response | goal met |",
                  "|---|---|---|---|"]
        for proto, m in o["trtkv"].items():
            us = m["cpu_us_per_response"]
            lines.append(f"| trtkv bench, {proto} | {m['responses']} | {us:.1f} | {'yes' if us <= 50 else 'no'} |")
        if "perf_analyzer_cpu_us_per_response" in o:
            lines.append(f"| perf_analyzer (C++), grpc | {o['perf_analyzer_responses']} | "
                         f"{o['perf_analyzer_cpu_us_per_response']:.1f} | — |")
        else:
            lines.append(f"| perf_analyzer | failed: {o.get('perf_analyzer_error')} | | |")
    m = r.get("max_rate")
    if m:
        lines += ["", f"## Highest sustainable request rate (trivial model, open loop, max_tokens {m['max_tokens']})", "",
                  "| offered req/s | achieved | failed | latency p50 ms | p99 ms | client CPU (cores) | sustained |",
                  "|---|---|---|---|---|---|---|"]
        for s in m["steps"]:
            lines.append(f"| {s['offered']:g} | {s['achieved']:.1f} | {s['failed']} | {s['request_latency_p50_ms']:.1f} | "
                         f"{s['request_latency_p99_ms']:.1f} | {s['client_cpu_cores']:.2f} | "
                         f"{'yes' if s['sustained'] else 'no'} |")
        lines += ["", f"Highest sustained: **{m['highest_sustained_rate']} requests/s** "
                  f"(= {(m['highest_sustained_rate'] or 0) * m['max_tokens']:.0f} streamed responses/s). When the client "
                  "uses well under one core at the limit, the limit is the server (the Python backend), not the client."]
    for note in r.get("notes", []):
        lines.append(f"- {note}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", default="smollm2_fp8kv", help="recipe whose workload (and server, when up) is used")
    ap.add_argument("--url", help="gRPC HOST:PORT of the real server (default: its server.json when present)")
    ap.add_argument("--skip-real", action="store_true", help="only the trivial model")
    ap.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    args = ap.parse_args(argv)
    recipe = load_recipe(args.recipe)
    tokenizer = load_tokenizer(tokenizer_dir(recipe))
    b = recipe.bench
    prompts = latency_prompts(tokenizer, 16, b.input_tokens)
    out_dir = paths.engines_dir() / "bench-crosscheck"
    results: dict[str, Any] = {"started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "recipe": recipe.name,
                               "machine": f"{os.cpu_count()} CPU cores, Python {sys.version.split()[0]}",
                               "side_by_side": [], "notes": []}
    n_trivial = 100 if args.quick else 400
    work = Path(tempfile.mkdtemp(prefix="trtkv-crosscheck-"))
    print(f"starting tritonserver on the trivial repository ({TRIVIAL_REPO}) ...", flush=True)
    server = localserver.start(TRIVIAL_REPO, work / "server")
    try:
        ep = check_endpoint(Endpoint(server.grpc_url, "grpc", "ensemble", source="trivial repo"))
        results["side_by_side"] += side_by_side("trivial", ep, prompts, tokenizer, b.output_tokens, [1, 4], n_trivial,
                                                n_trivial // 4, work, 30.0)
        http_ep = check_endpoint(Endpoint(server.http_url, "http", "ensemble", source="trivial repo"))
        results["client_overhead"] = client_overhead({"grpc": ep, "http": http_ep}, prompts, tokenizer, work,
                                                     requests=20 if args.quick else 40)
        rates = [25, 50, 75, 100, 150, 200, 300, 400, 600, 800, 1200, 1600]
        results["max_rate"] = max_rate(ep, prompts, tokenizer, rates, seconds=2.0 if args.quick else 3.0)
        write(out_dir, results)
    finally:
        server.stop()
    if not args.skip_real:
        try:
            real = check_endpoint(resolve_endpoint(recipe, args.url, "grpc", "ensemble"))
        except TrtkvError as exc:
            results["notes"].append(f"real server not measured: {str(exc).splitlines()[0]}")
        else:
            with supervise.quiet(recipe, "bench_crosscheck", args.url):  # no supervisor canaries in the measurement
                results["side_by_side"] += side_by_side(recipe.name, real, prompts, tokenizer, b.output_tokens,
                                                        list(b.concurrency), max(4, b.num_requests), 4, work,
                                                        b.request_timeout_s, pa_trials=5)
    write(out_dir, results)
    print(markdown(results))
    print(f"wrote {out_dir / 'results.md'} and results.json (work files: {work})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
