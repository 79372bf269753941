"""The client's sessions and processes (trtkv.bench.load.loadgen's pool, trtkv.bench.load.levels, trtkv.bench.load.workers)
against the replay server: one pool per level from warm-up to measured phase, streams sharded over worker processes with
their records merged, a dead worker's requests failed (never dropped), the client's own lag measured, the auto rule."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.openai_replay import MODEL, start, stats
from trtkv.bench.load import levels
from trtkv.bench.load.levels import CORE_SHARE, LevelSpec, Sweep, client_summary, workers_for
from trtkv.bench.load.loadgen import Job, SessionPool, run_concurrency
from trtkv.bench.load.workers import Fleet, split
from trtkv.bench.transport.client import Endpoint, SamplingParams
from trtkv.bench.transport.openai import OpenAISession
from trtkv.contracts.bench_doc import ERROR, NOT_SENT, OK, RequestRecord
from trtkv.core.progress import Progress

TOKENS = 8


@pytest.fixture(scope="module")
def replay() -> Iterator[tuple[Endpoint, int]]:
    proc, port = start(first_ms=10.0, gap_ms=2.0, default_tokens=TOKENS)
    try:
        yield Endpoint(f"127.0.0.1:{port}", "openai", MODEL), port
    finally:
        proc.terminate()
        proc.join()


def jobs(tag: str, count: int, start: int = 0) -> list[Job]:
    return [Job(RequestRecord(f"lvl-{tag}-{start + i}", tag, "lvl", i, 1, TOKENS), "hi", SamplingParams(TOKENS))
            for i in range(count)]


def new_connections(port: int) -> int:
    return int(stats(port)["connections"]) - 1  # the stats request's own connection


def test_a_pool_carries_the_warm_ups_connections_into_the_measured_phase(replay: tuple[Endpoint, int]) -> None:
    ep, port = replay
    new_connections(port)
    pool = SessionPool(lambda: OpenAISession(ep), 4)
    try:
        warm = run_concurrency(pool, jobs("warmup", 4), 4, 30.0)
        assert new_connections(port) == 4  # worker i sends job i first: every session carried a warm-up request
        measured = run_concurrency(pool, jobs("latency", 16), 4, 30.0)
        assert new_connections(port) == 0
    finally:
        pool.close()
    assert all(r.ok for r in warm + measured)
    # without a pool (a factory per phase), the measured phase opens its own
    run_concurrency(lambda: OpenAISession(ep), jobs("latency", 8), 4, 30.0)
    assert new_connections(port) == 4


def test_the_stream_loop_measures_its_own_lag(replay: tuple[Endpoint, int]) -> None:
    ep, _ = replay
    records = run_concurrency(lambda: OpenAISession(ep), jobs("latency", 16), 4, 30.0)
    lags = [v for r in records for v in r.client_lag_us]
    if sys.platform != "linux":
        assert lags == []
        return
    assert len(lags) >= 8  # one read in 8 of 16 x 9 reads
    assert all(0 <= v < 5_000_000 for v in lags)


def test_split_deals_streams_and_jobs_round_robin() -> None:
    shards = split(jobs("warmup", 5), jobs("latency", 12), streams=5, workers=2)
    assert [s.streams for s in shards] == [3, 2]
    assert [len(s.warmup) for s in shards] == [3, 2] and [len(s.measured) for s in shards] == [7, 5]
    assert {j.record.client_worker for j in shards[1].warmup + shards[1].measured} == {1}
    rate = split([], jobs("latency", 5), streams=64, workers=2, rate=10.0)
    assert rate[0].measured_at_s == [0.0, 0.2, 0.4] and rate[1].measured_at_s == [0.1, 0.3]
    assert [s.streams for s in rate] == [32, 32]


def test_workers_merge_their_records_and_report_their_cpu(replay: tuple[Endpoint, int]) -> None:
    ep, port = replay
    new_connections(port)
    records: list[RequestRecord] = []
    by_level: dict[str, list[RequestRecord]] = {}
    with Progress(False) as progress:
        sweep = Sweep(ep, lambda label, phase, first, n: jobs(phase, n, first), 2,
                      lambda name, total: progress.task(name, total).callback(), records, by_level, print)
        sweep.run(LevelSpec("lvl", "concurrency", 4, 4, 24, 30.0))
    assert new_connections(port) == 4  # two workers, two streams each, opened in their warm-ups only
    measured = by_level["lvl"]
    assert [r.request_id for r in measured] == [f"lvl-latency-{i}" for i in range(24)]
    assert all(r.ok and len(r.response_texts) == TOKENS for r in measured)
    assert {r.client_worker for r in measured} == {0, 1}
    sends = sorted(r.send_ns for r in measured)
    assert sends[-1] - sends[0] < 10e9  # one clock for both processes
    run = sweep.clients["lvl"]
    assert [w.streams for w in run.workers] == [2, 2] and all(w.cpu_ns > 0 and w.wall_ns > 0 for w in run.workers)
    assert len({w.pid for w in run.workers} | {os.getpid()}) == 3
    for r in measured:
        r.response_tokens = [1] * len(r.response_texts)
    client = client_summary(run, measured)
    assert client["workers"] == 2 and client["decided"] == "--workers 2"
    assert [w["output_tokens"] for w in client["per_worker"]] == [12 * TOKENS, 12 * TOKENS]
    assert all(w["cpu_us_per_token"] > 0 for w in client["per_worker"])


def test_a_dead_worker_fails_its_requests(replay: tuple[Endpoint, int]) -> None:
    ep, _ = replay
    shards = split(jobs("warmup", 2), jobs("latency", 40), streams=2, workers=2)
    fleet = Fleet(ep, shards, 30.0)
    try:
        fleet.warmup(lambda _r: None)
        fleet.links[1].proc.kill()  # its own pid: a worker this test started
        fleet.links[1].proc.join()
        measured = fleet.measure(lambda _r: None)
    finally:
        fleet.close()
    dead = [r for r in measured if r.client_worker == 1]
    assert len(measured) == 40 and len(dead) == 20
    assert all(r.status == ERROR and "exited with code" in r.error for r in dead)
    assert all(r.status == OK for r in measured if r.client_worker == 0)


def test_auto_keeps_one_process_under_the_share(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(levels, "available_cores", lambda: 8)
    assert workers_for(0.0) == 1 and workers_for(CORE_SHARE) == 1
    assert workers_for(CORE_SHARE * 1.01) == 2 and workers_for(CORE_SHARE * 3.5) == 4 and workers_for(100.0) == 8
    sweep = Sweep(Endpoint("127.0.0.1:1", "openai", MODEL), lambda *a: [], None, lambda *a: lambda _r: None, [], {},
                  print)
    spec = LevelSpec("concurrency=256", "concurrency", 256, 256, 10, 1.0)
    assert sweep._decide(spec, CORE_SHARE, None)[0] == 1
    assert sweep._decide(spec, CORE_SHARE * 1.5, None)[0] == 2
    # a saturated warm-up cannot show the need: the previous level's load per stream, scaled, counts too
    n, why = sweep._decide(spec, 0.95, lambda s: 0.02 * s.streams)
    assert n == 8 and "saturated" in why


def _bench_cmd(port: int, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "trtkv", "bench", "smollm2_fp8kv", "--protocol", "openai", "--url",
            f"127.0.0.1:{port}", "--tasks", "none", "--no-progress", "--output", str(out), "bench.input_tokens=16",
            "bench.output_tokens=8", "bench.warmup_requests=1", "bench.thresholds=[]", *extra]


@pytest.mark.e2e  # the CLI in a process of its own, ~10-25 s: with the e2e tests, not in `make check`
def test_ctrl_c_on_worker_processes_ends_at_once_with_partial_results(smollm2_dir: Path, tmp_path: Path) -> None:
    server, port = start(first_ms=5.0, gap_ms=20.0, default_tokens=8)  # 2000 requests take ~40 s: Ctrl-C comes first
    try:
        out = tmp_path / "out"
        cmd = _bench_cmd(port, out, "bench.concurrency=[8]", "bench.num_requests=2000", "--workers", "2")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        deadline, events = time.monotonic() + 60, 0
        while events < 200 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)  # interrupt once the measured phase streams (the warm-up sends 8 x 8 events)
            events += stats(port)["events"]
        asked = time.monotonic()
        proc.send_signal(signal.SIGINT)
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:  # the line that says the interrupt was taken, before the results are written
            lines.append(line)
            if "interrupted (Ctrl-C)" in line:
                break
        stopped = time.monotonic() - asked
        output = "".join(lines) + proc.communicate(timeout=120)[0]
    finally:
        server.terminate()
        server.join()
    assert proc.returncode == 130, output
    assert stopped < 5, (stopped, output)  # the workers stop within STOP_GRACE_S (writing the results comes after)
    data = json.loads((tmp_path / "out.partial" / "results.json").read_text())  # never over a complete run's
    assert data["partial"] is True
    latency = [r for r in data["records"] if r["phase"] == "latency"]
    assert len(latency) == 2000  # every request accounted for
    statuses = {r["status"] for r in latency}
    assert OK in statuses and NOT_SENT in statuses and {r["client_worker"] for r in latency} == {0, 1}


def test_a_failed_request_on_worker_processes_fails_the_bench(smollm2_dir: Path, tmp_path: Path) -> None:
    from trtkv.bench.runner import BenchOptions, run_bench
    from trtkv.recipe import load_recipe

    server, port = start(first_ms=300.0, gap_ms=1.0, default_tokens=4)  # every first token after the timeout
    try:
        recipe = load_recipe("smollm2_fp8kv", ["bench.concurrency=[2]", "bench.num_requests=4", "bench.warmup_requests=1",
                                               "bench.input_tokens=16", "bench.output_tokens=4", "bench.thresholds=[]",
                                               "bench.request_timeout_s=0.1"])
        opts = BenchOptions(url=f"127.0.0.1:{port}", protocol="openai", tasks=[], output=tmp_path / "out",
                            progress=False, workers=2)
        outcome = run_bench(recipe, opts)
    finally:
        server.terminate()
        server.join()
    assert outcome.exit_code == 1
    level = outcome.results["levels"]["concurrency=2"]
    assert level["request_count"]["timeout"] == 4 and level["client"]["workers"] == 2


def test_the_client_says_when_its_own_lag_or_cpu_may_have_held_a_level_back() -> None:
    from trtkv.bench.load.levels import ClientRun
    from trtkv.bench.load.workers import WorkerRun

    def record(lag_us: int) -> RequestRecord:
        rec = RequestRecord("lvl-latency-0", "latency", "lvl", 0, 1, 3)
        rec.status, rec.response_ns, rec.response_tokens = OK, [0, 10_000_000, 20_000_000], [1, 1, 1]  # ITL 10 ms
        rec.client_lag_us = [lag_us] * 10
        return rec

    calm = ClientRun([WorkerRun(0, 1, 4, cpu_ns=200_000_000, wall_ns=1_000_000_000)], "auto")
    assert "warning" not in client_summary(calm, [record(500)])
    late = client_summary(calm, [record(3000)])
    assert "lag p99 3.0 ms is 30% of the ITL p50 (10.0 ms)" in late["warning"]
    busy = ClientRun([WorkerRun(0, 1, 4, cpu_ns=950_000_000, wall_ns=1_000_000_000)], "auto")
    assert "used 0.95 of a core" in client_summary(busy, [record(500)])["warning"]
