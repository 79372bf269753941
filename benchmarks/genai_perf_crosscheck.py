"""GenAI-Perf and `trtkv bench` against the same served endpoint, side by side (`make bench-crosscheck`).

GenAI-Perf (`genai-perf profile -m ensemble --endpoint-type kserve --backend tensorrtllm --streaming`) is what
Triton + TensorRT-LLM users run; it drives the ensemble through its own perf_analyzer and sends
`exclude_input_in_output` with every request, so it also checks that trtkv's ensemble takes what upstream's clients
send. Both tools get the same input length (exact tokens), max_tokens and concurrency; GenAI-Perf makes its own
synthetic prompts, trtkv cuts them from the evaluation text.

GenAI-Perf lives in its own venv (`make install-genai-perf`: .venv-genai-perf, genai-perf 0.0.16 and
tritonclient 2.51.0 whose perf_analyzer needs libb64.so.0d and libcudart.so.12, linked from nvidia-pytriton's copies
in .venv-genai-perf/pa-libs). It loads the tokenizer from the recipe's checkpoint folder (never a hub).

Writes engines/bench-crosscheck/genai-perf/results.md and results.json; exits 1 when a tool failed a request.
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
from trtkv.core.errors import TrtkvError
from trtkv.recipe import load_recipe
from trtkv.serving import supervise

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_crosscheck import finish, trtkv_level  # noqa: E402

VENV = paths.project_root() / ".venv-genai-perf"
METRICS = [("time_to_first_token", "avg", "TTFT avg (ms)"), ("time_to_first_token", "p50", "TTFT p50 (ms)"),
           ("time_to_first_token", "p99", "TTFT p99 (ms)"), ("inter_token_latency", "avg", "ITL avg (ms)"),
           ("inter_token_latency", "p50", "ITL p50 (ms)"), ("request_latency", "avg", "latency avg (ms)"),
           ("output_sequence_length", "avg", "output tokens avg"),
           ("output_token_throughput", "avg", "output tokens/s"), ("request_throughput", "avg", "requests/s")]


def genai_perf_env() -> dict[str, str]:
    """PATH first on the side venv (genai-perf runs `perf_analyzer` from PATH), its libraries, no hub lookups."""
    env = dict(os.environ)
    env["PATH"] = f"{VENV / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["LD_LIBRARY_PATH"] = f"{VENV / 'pa-libs'}{os.pathsep}{env.get('LD_LIBRARY_PATH', '')}".rstrip(os.pathsep)
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    return env


# perf_analyzer 2.51 (r24.10), the last one shipped in the tritonclient wheel, records every FP32 output the model
# config declares for every response; for one a response does not carry (the ensemble's cum_log_probs, logits,
# acceptance_rate: TensorRT-LLM's backend sends them only when asked) it reads unset memory. When that memory reads
# as NaN/Inf, rapidjson stops writing the profile export, which stays empty while perf_analyzer exits 0; genai-perf
# then fails parsing it. Fixed upstream after r24.10 (perf_analyzer commit b192b035, "Fix inference response access
# resulting in segfault"); newer perf_analyzer wheels need glibc 2.38. Only that signature is retried.
EMPTY_EXPORT_TRIES = 3


def run_genai_perf(ep: Endpoint, tokenizer: Path, input_tokens: int, output_tokens: int, concurrency: int,
                   requests: int, warmup: int, artifacts: Path, timeout_s: float,
                   exe: Path | None = None) -> dict[str, Any]:
    """One genai-perf profile run; its `*_genai_perf.json` as a dict. A run that fails only because perf_analyzer
    left its profile export empty (see EMPTY_EXPORT_TRIES) is repeated, at most that many times in all."""
    exe = exe or VENV / "bin" / "genai-perf"
    if not exe.is_file():
        raise TrtkvError(f"{exe} is missing. Next: `make install-genai-perf` (a side venv: genai-perf pins its own "
                         f"dependencies).")
    name = f"c{concurrency}.json"
    cmd = [str(exe), "profile", "-m", ep.model, "--endpoint-type", "kserve", "--backend", "tensorrtllm",
           "--streaming", "-u", ep.url, "--tokenizer", str(tokenizer), "--concurrency", str(concurrency),
           "--request-count", str(requests), "--warmup-request-count", str(warmup),
           "--synthetic-input-tokens-mean", str(input_tokens), "--synthetic-input-tokens-stddev", "0",
           "--output-tokens-mean", str(output_tokens), "--output-tokens-stddev", "0", "--random-seed", "0",
           "--artifact-dir", str(artifacts), "--profile-export-file", name,
           "--", "--measurement-mode", "count_windows", "--measurement-request-count", str(requests)]
    artifacts.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, EMPTY_EXPORT_TRIES + 1):
        log = artifacts / f"genai-perf-c{concurrency}{'' if attempt == 1 else f'-try{attempt}'}.log"
        print(f"[genai-perf] concurrency {concurrency}: {' '.join(cmd[:4])} ... (log {log})", flush=True)
        with log.open("w") as fh:
            fh.write("$ " + " ".join(cmd) + "\n")
            fh.flush()
            proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=genai_perf_env(), timeout=timeout_s,
                                  check=False, start_new_session=True)
        found = sorted(artifacts.glob(f"*-concurrency{concurrency}/c{concurrency}_genai_perf.json"))
        if proc.returncode == 0 and found:
            return dict(json.loads(found[-1].read_text()))
        empty = [p for p in artifacts.glob(f"*-concurrency{concurrency}/{name}") if p.stat().st_size == 0]
        if not empty:
            break
        print(f"[genai-perf] perf_analyzer left {empty[0]} empty and exited 0 (its 2.51 exporter, see "
              f"EMPTY_EXPORT_TRIES in {Path(__file__).name}); try {attempt} of {EMPTY_EXPORT_TRIES}", flush=True)
        for path in empty:
            path.unlink()
    last = "\n".join(log.read_text().splitlines()[-15:])
    why = " (perf_analyzer's profile export was empty every time)" if empty else ""
    raise TrtkvError(f"genai-perf exited {proc.returncode}{why} (log {log}):\n{last}")


def trtkv_metrics(summary: dict[str, Any]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for metric, stat, label in METRICS:
        value = summary.get(metric)
        out[label] = value.get(stat) if isinstance(value, dict) else value
    return out


def genai_metrics(data: dict[str, Any]) -> dict[str, float | None]:
    return {label: (data.get(metric) or {}).get(stat) for metric, stat, label in METRICS}


def markdown(r: dict[str, Any]) -> str:
    lines = ["# GenAI-Perf vs trtkv bench", "",
             f"- run {r['started_at']}; endpoint grpc://{r['url']} model `{r['model']}` (recipe {r['recipe']}); "
             f"genai-perf {r['genai_perf_version']} (perf_analyzer count_windows, gRPC streaming)",
             f"- input {r['input_tokens']} tokens, max_tokens {r['output_tokens']}, {r['requests']} measured requests "
             f"per level; server and both clients share the machine's cores", ""]
    for level in r["levels"]:
        lines += [f"## concurrency {level['concurrency']}", "", "| metric | trtkv bench | GenAI-Perf | diff |",
                  "|---|---:|---:|---:|"]
        for label, mine in level["trtkv"].items():
            theirs = level["genai_perf"].get(label)
            diff = (f"{100 * (mine - theirs) / theirs:+.1f}%" if isinstance(mine, (int, float))
                    and isinstance(theirs, (int, float)) and theirs else "—")
            fmt = (lambda v: "—" if v is None else f"{v:.2f}")  # noqa: E731
            lines.append(f"| {label} | {fmt(mine)} | {fmt(theirs)} | {diff} |")
        lines.append("")
        lines.append(f"failed requests: trtkv {level['trtkv_failed']}, GenAI-Perf counted "
                     f"{level['genai_perf_requests']} completed")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", default="smollm2_fp8kv", help="recipe whose server and workload are used")
    ap.add_argument("--url", help="gRPC HOST:PORT (default: the recipe's running server, engines/<recipe>/serve)")
    ap.add_argument("--concurrency", default="1,2", help="comma-separated levels (default 1,2)")
    ap.add_argument("--requests", type=int, default=16, help="measured requests per level (default 16)")
    ap.add_argument("--output", type=Path, default=None, help="default engines/bench-crosscheck/genai-perf")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per genai-perf run")
    args = ap.parse_args(argv)
    recipe = load_recipe(args.recipe)
    b = recipe.bench
    out_dir = args.output or paths.engines_dir() / "bench-crosscheck" / "genai-perf"
    try:
        ep = resolve_endpoint(recipe, args.url, "grpc", "ensemble")
        ep = check_endpoint(ep)
    except TrtkvError as exc:
        print(f"error: {exc}\nNext: `make serve RECIPE={recipe.name}` first (or pass --url).", file=sys.stderr)
        return 2
    tok_dir = tokenizer_dir(recipe)
    tokenizer = load_tokenizer(tok_dir)
    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    prompts = latency_prompts(tokenizer, max(args.requests, 8), b.input_tokens)
    version = subprocess.run([str(VENV / "bin" / "python"), "-c",
                              "import importlib.metadata as m; print(m.version('genai-perf'))"],
                             capture_output=True, text=True, check=False).stdout.strip() or "unknown"
    results: dict[str, Any] = {"started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "recipe": recipe.name,
                               "url": ep.url, "model": ep.model, "input_tokens": b.input_tokens,
                               "output_tokens": b.output_tokens, "requests": args.requests,
                               "genai_perf_version": version, "levels": []}
    failed = False
    with supervise.quiet(recipe, "genai_perf_crosscheck", args.url):  # no supervisor canaries in the measurement
        for conc in levels:
            print(f"[trtkv] concurrency {conc} ...", flush=True)
            mine = trtkv_level(ep, prompts, tokenizer, args.requests, b.output_tokens, conc, b.request_timeout_s)
            summary = mine["summary"]
            theirs = run_genai_perf(ep, tok_dir, b.input_tokens, b.output_tokens, conc, args.requests,
                                    min(conc, 4), out_dir / "artifacts", args.timeout)
            counted = int((theirs.get("request_count") or {}).get("avg") or 0)
            trtkv_failed = int(summary["request_count"]["failed"])
            failed |= trtkv_failed > 0 or counted < args.requests
            results["levels"].append({"concurrency": conc, "trtkv": trtkv_metrics(summary),
                                      "genai_perf": genai_metrics(theirs), "trtkv_failed": trtkv_failed,
                                      "genai_perf_requests": counted})
    return finish(out_dir, results, markdown(results), failed)


if __name__ == "__main__":
    sys.exit(main())
