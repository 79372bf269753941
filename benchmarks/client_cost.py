"""What the benchmark client itself costs, trtkv's against AIPerf's (0.13.0 in .venv-aiperf: `make install-aiperf`), on
the replay server (tests/support/openai_replay.py: no model, vLLM-shaped SSE events, the first token --first-ms after
the request, then one every --gap-ms), so every latency the clients should see is known.

For each repeat and each stream count both tools run, one after the other, the order alternating (trtkv first, then
AIPerf first next time), each against a fresh replay server and each as a process tree of its own
(`trtkv bench ... --protocol openai`, `aiperf profile --streaming`), the same warm-up (one request per stream) and
measured request count. Per run, from each tool's own per-request records (trtkv's results.json, AIPerf's
profile_export.jsonl), over its measured window (first send to last end):

- output tokens/s, and client CPU us per token: the CPU (user + system) of the tool's whole process tree inside the
  window, read from /proc every 100 ms (its worker processes included), over the tokens it received;
- ITL p50 against the true gap, TTFT p50/p99 (true: --first-ms), the client's lag per request (latency over the
  server's timetable: first + (tokens - 1) * gap), streams held (time-averaged requests in flight);
- the replay server's own lateness (/v1/replay/stats), the 1-minute load average, and how busy the machine's cores were.

    nice -n 10 .venv/bin/python benchmarks/client_cost.py --streams 16,64,256 --repeats 3
    nice -n 10 .venv/bin/python benchmarks/client_cost.py --tools trtkv --trtkv-workers 1 --gap-ms 5 \\
        --streams 32,64,128,256          # one process's lag against its load (the --workers auto threshold)
    nice -n 10 .venv/bin/python benchmarks/client_cost.py --tools trtkv:1,trtkv:2 --gap-ms 5 --streams 128,256

Writes engines/client-cost/results.json (every run) and results.md (medians and ranges per level); exits 1 when a
tool failed a request.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: tests/support's replay server

from tests.support.openai_replay import MODEL, start, stats  # noqa: E402
from trtkv.bench.load.prompts import tokenizer_dir  # noqa: E402
from trtkv.core import paths  # noqa: E402
from trtkv.recipe import load_recipe  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
AIPERF = ROOT / ".venv-aiperf" / "bin" / "aiperf"
TICK = os.sysconf("SC_CLK_TCK")


# -----------------------------------------------------------------------------------------------------------------
# CPU of a process tree, sampled from /proc


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, utime + stime in clock ticks) of a live process."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), int(fields[11]) + int(fields[12])


def _machine_busy() -> tuple[int, int]:
    """(busy, total) jiffies of all cores since boot, from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


class TreeSampler(threading.Thread):
    """Every 100 ms: the CPU of `root` and its descendants (a process that exits keeps its last reading), with the
    monotonic and wall-clock time of the sample; descendants are looked for once a second."""

    def __init__(self, root: int) -> None:
        super().__init__(daemon=True)
        self.root, self.pids, self.last = root, {root}, {}  # type: ignore[var-annotated]
        self.samples: list[tuple[int, int, float, tuple[int, int]]] = []  # (mono ns, wall ns, cpu s, machine)
        self.halt = threading.Event()

    def _descendants(self) -> None:
        children: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit() and (st := _stat(int(entry))) is not None:
                children.setdefault(st[0], []).append(int(entry))
        todo = [self.root]
        while todo:
            pid = todo.pop()
            self.pids.add(pid)
            todo += children.get(pid, [])

    def run(self) -> None:
        n = 0
        while not self.halt.is_set():
            if n % 10 == 0:
                self._descendants()
            for pid in list(self.pids):
                st = _stat(pid)
                if st is not None:
                    self.last[pid] = st[1]
            self.samples.append((time.monotonic_ns(), time.time_ns(), sum(self.last.values()) / TICK, _machine_busy()))
            n += 1
            self.halt.wait(0.1)

    def cpu_between(self, wall0_ns: int, wall1_ns: int) -> tuple[float, float]:
        """(tree CPU seconds, machine busy cores) between two wall-clock instants, interpolated between samples."""
        def at(wall: int, index: int) -> float:
            s = self.samples
            for (_, w0, c0, m0), (_, w1, c1, m1) in zip(s, s[1:], strict=False):
                if w0 <= wall <= w1:
                    f = (wall - w0) / max(1, w1 - w0)
                    a, b = (c0, c1) if index == 0 else (m0[0] / TICK, m1[0] / TICK)
                    return a + f * (b - a)
            edge = s[0] if wall < s[0][1] else s[-1]
            return edge[2] if index == 0 else edge[3][0] / TICK
        cpu = at(wall1_ns, 0) - at(wall0_ns, 0)
        busy = (at(wall1_ns, 1) - at(wall0_ns, 1)) / max(1e-9, (wall1_ns - wall0_ns) / 1e9)
        return cpu, busy


# -----------------------------------------------------------------------------------------------------------------
# One tool's run


@dataclass
class Request:
    send_ns: int  # wall clock
    first_ns: int | None
    end_ns: int
    tokens: int
    itl_ms: float | None
    ok: bool


@dataclass
class Run:
    tool: str
    streams: int
    repeat: int
    order: int  # 0: ran first at this level and repeat
    figures: dict[str, Any] = field(default_factory=dict)
    failed: int = 0
    note: str = ""


def _trtkv(port: int, args: argparse.Namespace, streams: int, out: Path,
           workers: str) -> tuple[subprocess.Popen[bytes], Any]:
    cmd = [sys.executable, "-m", "trtkv", "bench", "smollm2_fp8kv", "--protocol", "openai", "--url",
           f"127.0.0.1:{port}", "--model", MODEL, "--tasks", "none", "--no-progress", "--output", str(out),
           "--workers", workers, f"bench.concurrency=[{streams}]", f"bench.num_requests={_requests(args, streams)}",
           "bench.warmup_requests=1", "bench.input_tokens=16", f"bench.output_tokens={args.tokens}",
           "bench.thresholds=[]", f"bench.request_timeout_s={args.timeout}"]
    log = (out.parent / f"{out.name}.log").open("w")
    return subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT), log


def _trtkv_records(out: Path) -> tuple[list[Request], dict[str, Any]]:
    data = json.loads((out / "results.json").read_text())
    origin = int(data["time_origin"]["unix_ns"])
    reqs = []
    for r in data["records"]:
        if r["phase"] != "latency":
            continue
        ms = lambda v: origin + round(v * 1e6)  # noqa: E731
        times = r["response_times_ms"]
        itl = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None
        reqs.append(Request(ms(r["send_time_ms"]), ms(times[0]) if times else None,
                            ms(r["end_time_ms"] if r["end_time_ms"] is not None else r["send_time_ms"]),
                            int(r["output_tokens"]), itl, r["status"] == "ok"))
    (level,) = data["levels"].values()
    return reqs, level.get("client", {})


def _aiperf(port: int, args: argparse.Namespace, streams: int, out: Path,
           _workers: str = "") -> tuple[subprocess.Popen[bytes], Any]:
    out.mkdir(parents=True, exist_ok=True)
    dataset = out / "prompts.jsonl"
    rows = streams + _requests(args, streams)
    dataset.write_text("".join(json.dumps({"text": "Tell me about the sea.", "output_length": args.tokens}) + "\n"
                               for _ in range(rows)))
    tokenizer = tokenizer_dir(load_recipe("smollm2_fp8kv"))
    cmd = [str(AIPERF), "profile", "--model", MODEL, "--url", f"http://127.0.0.1:{port}", "--endpoint-type",
           "completions", "--streaming", "--tokenizer", str(tokenizer), "--input-file", str(dataset),
           "--custom-dataset-type", "single_turn", "--dataset-sampling-strategy", "sequential",
           "--concurrency", str(streams), "--request-count", str(_requests(args, streams)),
           "--warmup-request-count", str(streams), "--artifact-dir", str(out), "--ui-type", "none"]
    # AIPerf 0.13 cannot load a local tokenizer folder under HF_HUB_OFFLINE=1 (benchmarks/aiperf_crosscheck.py)
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    log = (out.parent / f"{out.name}.log").open("w")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), log


def _aiperf_records(out: Path) -> tuple[list[Request], dict[str, Any]]:
    reqs = []
    for line in (out / "profile_export.jsonl").read_text().splitlines():
        row = json.loads(line)
        meta, metrics = row.get("metadata", {}), row.get("metrics", {})
        if meta.get("benchmark_phase") != "profiling":
            continue
        def value(key: str, metrics: dict[str, Any] = metrics) -> Any:
            return (metrics.get(key) or {}).get("value")

        ttft = value("time_to_first_token")
        start_ns = int(meta["request_start_ns"])
        reqs.append(Request(start_ns, None if ttft is None else start_ns + round(ttft * 1e6), int(meta["request_end_ns"]),
                            int(value("output_token_count") or 0), value("inter_token_latency"),
                            not row.get("error") and ttft is not None))
    return reqs, {}


def _requests(args: argparse.Namespace, streams: int) -> int:
    return max(args.min_requests, args.waves * streams)


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    data = sorted(values)
    return data[min(len(data) - 1, round(q * (len(data) - 1)))]


def figures(reqs: list[Request], args: argparse.Namespace, sampler: TreeSampler) -> dict[str, Any]:
    ok = [r for r in reqs if r.ok and r.first_ns is not None]
    start_ns, end_ns = min(r.send_ns for r in reqs), max(r.end_ns for r in reqs)
    window_s = (end_ns - start_ns) / 1e9
    tokens = sum(r.tokens for r in ok)
    cpu_s, busy = sampler.cpu_between(start_ns, end_ns)
    schedule_ms = args.first_ms + (args.tokens - 1) * args.gap_ms
    lag = [(r.end_ns - r.send_ns) / 1e6 - schedule_ms for r in ok]
    itl = [r.itl_ms for r in ok if r.itl_ms is not None]
    ttft = [((r.first_ns or 0) - r.send_ns) / 1e6 for r in ok]
    return {"requests": len(reqs), "window_s": window_s, "tokens_per_s": tokens / window_s if window_s else None,
            "cpu_s": cpu_s, "cpu_us_per_token": cpu_s / tokens * 1e6 if tokens else None,
            "cpu_cores": cpu_s / window_s if window_s else None,
            "itl_p50_ms": _pct(itl, 0.5), "itl_drift": (_pct(itl, 0.5) or 0) / args.gap_ms - 1 if itl else None,
            "ttft_p50_ms": _pct(ttft, 0.5), "ttft_p99_ms": _pct(ttft, 0.99),
            "lag_p50_ms": _pct(lag, 0.5), "lag_p99_ms": _pct(lag, 0.99),
            "streams_held": sum((r.end_ns - r.send_ns) / 1e9 for r in reqs) / window_s if window_s else None,
            "machine_busy_cores": busy}


def run_tool(tool: str, args: argparse.Namespace, streams: int, repeat: int, order: int, out_dir: Path) -> Run:
    server, port = start(args.first_ms, args.gap_ms, args.tokens)
    run = Run(tool, streams, repeat, order)
    name, _, workers = tool.partition(":")  # trtkv:N: trtkv with --workers N
    out = out_dir / "runs" / f"{name}{workers}-s{streams}-r{repeat}"
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        proc, log = (_trtkv if name == "trtkv" else _aiperf)(port, args, streams, out, workers or args.trtkv_workers)
        sampler = TreeSampler(proc.pid)
        sampler.start()
        try:
            rc = proc.wait(timeout=args.run_timeout)
        finally:
            sampler.halt.set()
            sampler.join()
            log.close()
        seen = stats(port)
        reqs, own = (_trtkv_records if name == "trtkv" else _aiperf_records)(out)
        run.failed = sum(not r.ok for r in reqs) + (rc not in (0, 1))
        run.figures = {**figures(reqs, args, sampler), "exit_code": rc, "server_late_p99_ms": seen["late_ms"]["p99"],
                       "server_first_late_p99_ms": seen["first_late_ms"]["p99"],
                       "load_1min": os.getloadavg()[0]}
        if own:
            run.figures["own_report"] = {k: own.get(k) for k in ("workers", "decided", "cpu_us_per_token", "cpu_cores",
                                                                   "lag_ms")}
    except (OSError, ValueError, KeyError, subprocess.TimeoutExpired) as exc:
        run.failed, run.note = run.failed or 1, f"{type(exc).__name__}: {exc}"
    finally:
        server.terminate()
        server.join()
    return run


# -----------------------------------------------------------------------------------------------------------------
# Report


COLUMNS = [("tokens_per_s", "tokens/s", 0), ("cpu_us_per_token", "CPU us/token", 1), ("itl_p50_ms", "ITL p50 ms", 2),
           ("itl_drift", "ITL vs gap", None), ("ttft_p50_ms", "TTFT p50 ms", 1), ("ttft_p99_ms", "TTFT p99 ms", 1),
           ("lag_p99_ms", "lag p99 ms", 1), ("server_late_p99_ms", "server late p99 ms", 1),
           ("server_first_late_p99_ms", "server first-token late p99 ms", 1),
           ("streams_held", "streams held", 1), ("machine_busy_cores", "busy cores", 2), ("load_1min", "load", 1)]


def _cell(values: list[float], digits: int | None) -> str:
    if not values:
        return "—"
    fmt = (lambda v: f"{v:+.1%}") if digits is None else (lambda v: f"{v:.{digits}f}")  # noqa: E731
    mid = statistics.median(values)
    return fmt(mid) if len(values) == 1 else f"{fmt(mid)} ({fmt(min(values))}–{fmt(max(values))})"


def markdown(results: dict[str, Any]) -> str:
    a = results["args"]
    lines = [f"# Client cost: {' vs '.join(a['tools'])} on the replay server", "",
             f"- {results['started_at']}; first token {a['first_ms']:g} ms, then one every {a['gap_ms']:g} ms, "
             f"{a['tokens']} tokens a request; warm-up one request per stream, measured max({a['min_requests']}, "
             f"{a['waves']} x streams); {a['repeats']} repeats, tools interleaved (order alternating); trtkv "
             f"--workers {a['trtkv_workers']}; nice {os.nice(0)}; {results['cores']} cores",
             "- median (min–max) over repeats; CPU: the tool's whole process tree inside its measured window", ""]
    header = ["streams", "tool", *(c[1] for c in COLUMNS), "failed"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for streams in a["streams"]:
        for tool in a["tools"]:
            runs = [r for r in results["runs"] if r["streams"] == streams and r["tool"] == tool]
            cells = [_cell([r["figures"][k] for r in runs if r["figures"].get(k) is not None], d) for k, _, d in COLUMNS]
            lines.append(f"| {streams} | {tool} | " + " | ".join(cells) + f" | {sum(r['failed'] for r in runs)} |")
    ratios = []
    for streams in a["streams"]:
        cost = {tool: [r["figures"].get("cpu_us_per_token") for r in results["runs"]
                       if r["streams"] == streams and r["tool"] == tool] for tool in ("trtkv", "aiperf")}
        mine, theirs = cost["trtkv"], cost["aiperf"]  # trtkv:N runs are compared in the table only
        pairs = [m / t for m, t in zip(mine, theirs, strict=False) if m and t]
        if pairs:
            ratios.append(f"{streams} streams {statistics.median(pairs):.2f}x ({min(pairs):.2f}–{max(pairs):.2f})")
    if ratios:
        lines += ["", "trtkv's CPU per token over AIPerf's, run by run: " + "; ".join(ratios)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", default="16,64,256", help="stream counts (concurrency), comma separated")
    ap.add_argument("--tools", default="trtkv,aiperf",
                    help="comma separated: trtkv, aiperf, trtkv:N (trtkv with --workers N)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64, help="tokens a request")
    ap.add_argument("--first-ms", type=float, default=50.0)
    ap.add_argument("--gap-ms", type=float, default=20.0)
    ap.add_argument("--waves", type=int, default=4, help="measured requests: this many per stream ...")
    ap.add_argument("--min-requests", type=int, default=256, help="... and at least this many")
    ap.add_argument("--trtkv-workers", default="auto", help="trtkv bench --workers (default auto)")
    ap.add_argument("--timeout", type=float, default=60.0, help="request timeout, s")
    ap.add_argument("--run-timeout", type=float, default=600.0, help="one tool's run, s")
    ap.add_argument("--output", type=Path, default=None, help="default engines/client-cost")
    args = ap.parse_args(argv)
    args.streams = [int(s) for s in args.streams.split(",") if s.strip()]
    args.tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    if any(t.split(":")[0] not in ("trtkv", "aiperf") for t in args.tools):
        ap.error(f"--tools {','.join(args.tools)}: allowed trtkv, aiperf, trtkv:N")
    if "aiperf" in args.tools and not AIPERF.is_file():
        print(f"error: {AIPERF} is missing. Next: `make install-aiperf`.", file=sys.stderr)
        return 2
    out_dir = args.output or paths.engines_dir() / "client-cost"
    out_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "args": vars(args) | {"output": str(out_dir)},
                               "cores": os.cpu_count(), "runs": []}
    for repeat in range(args.repeats):
        for i, streams in enumerate(args.streams):
            tools = args.tools if (repeat + i) % 2 == 0 else args.tools[::-1]
            for order, tool in enumerate(tools):
                run = run_tool(tool, args, streams, repeat, order, out_dir)
                results["runs"].append(asdict(run))
                f = run.figures
                print(f"[{tool:6s} {streams:4d} streams r{repeat}] {f.get('tokens_per_s') or 0:8.0f} tok/s "
                      f"{f.get('cpu_us_per_token') or 0:6.1f} us/tok ITL p50 {f.get('itl_p50_ms') or 0:6.2f} ms "
                      f"TTFT p50/p99 {f.get('ttft_p50_ms') or 0:.1f}/{f.get('ttft_p99_ms') or 0:.1f} ms held "
                      f"{f.get('streams_held') or 0:.1f} load {f.get('load_1min') or 0:.1f} failed {run.failed} "
                      f"{run.note}", flush=True)
                (out_dir / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (out_dir / "results.md").write_text(markdown(results))
    print(markdown(results))
    return 1 if any(r["failed"] for r in results["runs"]) else 0


if __name__ == "__main__":
    sys.exit(main())
