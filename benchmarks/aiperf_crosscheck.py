"""AIPerf and `trtkv bench` against the same OpenAI-compatible endpoint, one after the other, side by side
(`make bench-crosscheck RECIPE=smollm2_fp8kv_vllm`).

AIPerf (NVIDIA's benchmark client, pinned 0.13.0 in .venv-aiperf: `make install-aiperf`) runs `aiperf profile
--endpoint-type completions --streaming` on the very prompts trtkv's client sends (the recipe's input length, as a
single_turn --input-file read sequentially, warm-up ones first), max_tokens the recipe's output length, greedy
(--extra-inputs temperature:0 top_p:1, as trtkv sends), the same concurrency and request count. The same prompts
matter: on vLLM CPU the first token of some prompts takes one more engine step (~0.5 s) than others, so synthetic
prompts give another TTFT mix. Prints TTFT p50/avg/p99, ITL p50 and output token throughput with the ratio
trtkv/AIPerf and every request's TTFT from both tools, and writes engines/bench-crosscheck/aiperf/results.md and
results.json. Exits 1 when a tool failed a request, 2 when the server is not there.

`--replay FIRST_MS,GAP_MS` points both tools at benchmarks/openai_replay.py instead (a server with no model that sends
the first token FIRST_MS after the request and the rest GAP_MS apart): there every TTFT and ITL is known, so it shows
how far the two clients agree when the server does the same thing every time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from trtkv.bench.load.prompts import latency_prompts, load_tokenizer, tokenizer_dir
from trtkv.bench.runner import resolve_endpoint
from trtkv.bench.transport.client import Endpoint
from trtkv.bench.transport.endpoints import check_endpoint
from trtkv.core import paths
from trtkv.core.apikey import api_key, redact
from trtkv.core.errors import TrtkvError
from trtkv.recipe import load_recipe
from trtkv.serving import supervise

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: tests/support's shared servers
from bench_crosscheck import finish, trtkv_level  # noqa: E402

from tests.support.openai_replay import MODEL as REPLAY_MODEL  # noqa: E402
from tests.support.openai_replay import start as start_replay  # noqa: E402

VENV = paths.project_root() / ".venv-aiperf"
METRICS = [("time_to_first_token", "p50", "TTFT p50 (ms)"), ("time_to_first_token", "avg", "TTFT avg (ms)"),
           ("time_to_first_token", "p99", "TTFT p99 (ms)"),
           ("inter_token_latency", "p50", "ITL p50 (ms)"), ("output_token_throughput", "avg", "output tokens/s"),
           ("request_latency", "avg", "latency avg (ms)"), ("output_sequence_length", "avg", "output tokens avg")]


def run_aiperf(ep: Endpoint, tokenizer: Path, prompts: list[str], output_tokens: int, concurrency: int, requests: int,
               warmup: int, artifacts: Path, timeout_s: float) -> dict[str, Any]:
    """AIPerf on the same prompts as trtkv's level, in the same order (warm-up ones first), greedy like trtkv's."""
    exe = VENV / "bin" / "aiperf"
    if not exe.is_file():
        raise TrtkvError(f"{exe} is missing. Next: `make install-aiperf` (AIPerf 0.13.0 in a venv of its own).")
    run_dir = artifacts / f"c{concurrency}"
    run_dir.mkdir(parents=True, exist_ok=True)
    dataset = artifacts / f"prompts-c{concurrency}.jsonl"
    rows = [prompts[i % len(prompts)] for i in range(warmup)] + [prompts[i % len(prompts)] for i in range(requests)]
    dataset.write_text("".join(json.dumps({"text": text, "output_length": output_tokens}) + "\n" for text in rows))
    cmd = [str(exe), "profile", "--model", ep.model, "--url", f"http://{ep.url}", "--endpoint-type", "completions",
           "--streaming", "--tokenizer", str(tokenizer), "--input-file", str(dataset), "--custom-dataset-type",
           "single_turn", "--dataset-sampling-strategy", "sequential", "--extra-inputs", "temperature:0",
           "top_p:1", "--concurrency", str(concurrency), "--request-count", str(requests),
           "--warmup-request-count", str(warmup), "--artifact-dir", str(run_dir), "--ui-type", "none"]
    if api_key() is not None:  # a keyed server (trtkv deploy's vLLM): AIPerf sends Authorization: Bearer <key>
        cmd += ["--api-key", str(api_key())]
    run_dir.mkdir(parents=True, exist_ok=True)
    log = artifacts / f"aiperf-c{concurrency}.log"
    print(f"[aiperf] concurrency {concurrency}: {' '.join(cmd[:3])} ... (log {log})", flush=True)
    # the tokenizer is a local folder; AIPerf 0.13 fails to load one at all under HF_HUB_OFFLINE=1 ("Repo id must be
    # in the form 'repo_name'..."), so the offline switches are left unset for it
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    with log.open("w") as fh:
        fh.write("$ " + redact(" ".join(cmd)) + "\n")  # the key never reaches the log
        fh.flush()
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, timeout=timeout_s, check=False,
                              start_new_session=True)
    export = run_dir / "profile_export_aiperf.json"
    if proc.returncode != 0 or not export.is_file():
        last = "\n".join(log.read_text().splitlines()[-15:])
        raise TrtkvError(f"aiperf exited {proc.returncode} (log {log}):\n{last}")
    return dict(json.loads(export.read_text()))


def aiperf_ttfts(run_dir: Path) -> list[float]:
    """Per-request TTFT (ms) of AIPerf's profiling phase, from its profile_export.jsonl, sorted."""
    out = []
    path = run_dir / "profile_export.jsonl"
    for line in path.read_text().splitlines() if path.is_file() else []:
        row = json.loads(line)
        if row.get("metadata", {}).get("benchmark_phase") == "profiling":
            value = (row.get("metrics", {}).get("time_to_first_token") or {}).get("value")
            if value is not None:
                out.append(float(value))
    return sorted(out)


def pick(data: dict[str, Any]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for metric, stat, label in METRICS:
        value = data.get(metric)
        out[label] = value.get(stat) if isinstance(value, dict) else None
    return out


def markdown(r: dict[str, Any]) -> str:
    lines = ["# AIPerf vs trtkv bench (OpenAI protocol)", "",
             f"- run {r['started_at']}; endpoint http://{r['url']} model `{r['model']}` (recipe {r['recipe']}"
             + (f"'s workload; benchmarks/openai_replay.py: first token {r['replay'].split(',')[0]} ms, then one "
                f"every {r['replay'].split(',')[1]} ms" if r.get("replay") else "") + "); "
             f"AIPerf {r['aiperf_version']}, streaming /v1/completions",
             f"- input {r['input_tokens']} tokens, max_tokens {r['output_tokens']}, {r['requests']} measured requests per "
             f"level, the two clients one after the other ({'AIPerf' if r.get('aiperf_first') else 'trtkv'} first); server "
             f"and client share the machine's cores", ""]
    for level in r["levels"]:
        lines += [f"## concurrency {level['concurrency']}", "", "| metric | trtkv bench | AIPerf | trtkv / AIPerf |",
                  "|---|---:|---:|---:|"]
        for label, mine in level["trtkv"].items():
            theirs = level["aiperf"].get(label)
            ratio = (f"{mine / theirs:.3f}" if isinstance(mine, (int, float)) and isinstance(theirs, (int, float))
                     and theirs else "—")
            fmt = (lambda v: "—" if v is None else f"{v:.2f}")  # noqa: E731
            lines.append(f"| {label} | {fmt(mine)} | {fmt(theirs)} | {ratio} |")
        lines += ["", f"failed requests: trtkv {level['trtkv_failed']}, AIPerf {level['aiperf_failed']}; trtkv client "
                      f"CPU {level['trtkv_cpu_us_per_token']:.1f} us per streamed token", ""]
        for tool in ("trtkv", "aiperf"):
            values = level.get("ttft_ms", {}).get(tool) or []
            lines.append(f"- every request's TTFT, sorted ({tool}): {', '.join(f'{v:.0f}' for v in values)} ms")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", default="smollm2_fp8kv_vllm", help="recipe whose server and workload are used")
    ap.add_argument("--url", help="HOST:PORT of the OpenAI server (default: the recipe's running server)")
    ap.add_argument("--model", default="", help="served model name (default: the one /v1/models lists)")
    ap.add_argument("--concurrency", default="1,2", help="comma-separated levels (default 1,2)")
    ap.add_argument("--requests", type=int, default=8, help="measured requests per level (default 8)")
    ap.add_argument("--output", type=Path, default=None, help="default engines/bench-crosscheck/aiperf")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per AIPerf run")
    ap.add_argument("--aiperf-first", action="store_true",
                    help="run AIPerf before trtkv at each level (default after), to see whether the order matters")
    ap.add_argument("--replay", metavar="FIRST_MS,GAP_MS", default=None,
                    help="measure benchmarks/openai_replay.py (known TTFT and ITL, no model) instead of a server")
    args = ap.parse_args(argv)
    recipe = load_recipe(args.recipe)
    out_dir = args.output or paths.engines_dir() / "bench-crosscheck" / ("aiperf-replay" if args.replay else "aiperf")
    replay = None
    if args.replay:
        try:
            first_ms, gap_ms = (float(v) for v in args.replay.split(","))
        except ValueError:
            ap.error(f"--replay {args.replay!r}: expected FIRST_MS,GAP_MS, e.g. --replay 300,50")
        replay, port = start_replay(first_ms, gap_ms)
        args.url, args.model = f"127.0.0.1:{port}", REPLAY_MODEL
    try:
        return crosscheck(args, recipe, out_dir)
    finally:
        if replay is not None:
            replay.terminate()
            replay.join()


def crosscheck(args: argparse.Namespace, recipe: Any, out_dir: Path) -> int:
    b = recipe.bench
    try:
        ep = check_endpoint(resolve_endpoint(recipe, args.url, "openai", args.model))
    except TrtkvError as exc:
        print(f"error: {exc}\nNext: `make serve RECIPE={recipe.name}` first (or pass --url).", file=sys.stderr)
        return 2
    tok_dir = tokenizer_dir(recipe)
    tokenizer = load_tokenizer(tok_dir)
    hf = paths.recipe_output_dir(recipe.name) / "checkpoint" / "hf"
    aiperf_tokenizer = hf if (hf / "config.json").is_file() else tok_dir  # AIPerf's loader wants the model's config.json
    prompts = latency_prompts(tokenizer, max(args.requests, 8), b.input_tokens)
    version = subprocess.run([str(VENV / "bin" / "python"), "-c",
                              "import importlib.metadata as m; print(m.version('aiperf'))"],
                             capture_output=True, text=True, check=False).stdout.strip() or "unknown"
    results: dict[str, Any] = {"started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "recipe": recipe.name,
                               "url": ep.url, "model": ep.model, "input_tokens": b.input_tokens,
                               "output_tokens": b.output_tokens, "requests": args.requests, "aiperf_version": version,
                               "aiperf_first": args.aiperf_first, "replay": args.replay,
                               "levels": []}
    with supervise.quiet(recipe, "aiperf_crosscheck", args.url):  # the supervisor's canaries would be measured too
        failed = measure(args, recipe, ep, prompts, tokenizer, aiperf_tokenizer, out_dir, results)
    return finish(out_dir, results, markdown(results), failed)


def measure(args: argparse.Namespace, recipe: Any, ep: Endpoint, prompts: list[str], tokenizer: Any,
            aiperf_tokenizer: Path, out_dir: Path, results: dict[str, Any]) -> bool:
    """Both tools at each level, into results["levels"]; True when any request failed."""
    b = recipe.bench
    failed = False
    for conc in [int(c) for c in args.concurrency.split(",") if c.strip()]:
        def ours(level: int) -> dict[str, Any]:
            print(f"[trtkv] concurrency {level} ...", flush=True)
            return trtkv_level(ep, prompts, tokenizer, args.requests, b.output_tokens, level, b.request_timeout_s)

        def aiperf(level: int) -> dict[str, Any]:
            return run_aiperf(ep, aiperf_tokenizer, prompts, b.output_tokens, level, args.requests, level,
                              out_dir / "artifacts", args.timeout)

        if args.aiperf_first:
            theirs = aiperf(conc)
            mine = ours(conc)
        else:
            mine = ours(conc)
            theirs = aiperf(conc)
        summary = mine["summary"]
        errors = int(sum(e.get("count", 0) for e in theirs.get("error_summary") or []))
        trtkv_failed = int(summary["request_count"]["failed"])
        failed |= trtkv_failed > 0 or errors > 0
        cpu = (summary.get("client_cpu_per_token") or {}).get("avg") or 0.0
        ttft = {"trtkv": sorted(t for r in mine["records"] if (t := r.ttft_ms()) is not None),
                "aiperf": aiperf_ttfts(out_dir / "artifacts" / f"c{conc}")}
        results["levels"].append({"concurrency": conc, "trtkv": pick(summary), "aiperf": pick(theirs),
                                  "trtkv_failed": trtkv_failed, "aiperf_failed": errors,
                                  "trtkv_cpu_us_per_token": cpu, "ttft_ms": ttft})
    return failed


if __name__ == "__main__":
    sys.exit(main())
