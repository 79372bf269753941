"""One level of the latency sweep: its sessions kept from the warm-up into the measured phase, in
this process or sharded over worker processes (trtkv.bench.load.workers) when one process's CPU
would hold the level back; and the client's own cost per process (CPU per token, lag) for
results.json.

How many processes (`--workers auto`, the default): one, unless a process would carry more than
CORE_SHARE of a core. The load is read, not guessed: the level's own warm-up (run in this process)
measures its CPU time over its wall time; a level after the first starts from the previous level's
load per stream. Over the share the measured phase runs on ceil(load / CORE_SHARE) processes (at
most the cores this process may use), each warmed up on its own first, so every measured request
still goes over a connection opened in a warm-up. `--workers N` fixes the number.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from trtkv.bench.load.loadgen import (
    MAX_INFLIGHT,
    Interrupted,
    Job,
    SessionPool,
    run_concurrency,
    run_rate,
)
from trtkv.bench.load.workers import Fleet, WorkerRun, split
from trtkv.bench.transport.client import Endpoint
from trtkv.bench.transport.endpoints import session_factory
from trtkv.contracts.bench_doc import RequestRecord
from trtkv.measures.stats import summarize

# One process is kept while its warm-up used at most 0.3 of a core; past one core the GIL caps it.
# Measured on the replay server (docs/bench.md, "One process or several"): on 2 cores shared with
# other work one process fell behind (ITL +10-70%) at 12.5K tokens/s, where two held 16.5K within
# 1.5%. With only the client busy (2026-12-02, 256 streams, 50 ms then 20 ms, 1,024 requests), one
# process's warm-up used 0.31-0.39 of a core and its TTFT p99 was 1.4-2.8x its p50 (12 runs, 7 over
# 2x: its own lag p99 up to 96 ms, the server's first tokens at most 31 ms late), where two
# processes kept it at 1.4-2.0x (10 runs): the knee is a level's first-token burst (every stream
# sends at once), not the token rate. Half a core, the earlier bound, left that burst to one
# process.
CORE_SHARE = 0.3
# a process at this share of a core or more has probably limited the level (said in results)
SATURATED = 0.9
# the client's lag p99 over this share of the ITL p50 is said in results: its timestamps carry it
LAG_SHARE = 0.1

# (level label, phase, first index, count) -> jobs
JobMaker = Callable[[str, str, int, int], list[Job]]
# (name, total) -> a per-request callback
PhaseProgress = Callable[[str, int], Callable[[Any], None]]


@dataclass
class LevelSpec:
    label: str  # "concurrency=64" or "rate=8/s"
    mode: str  # "concurrency" or "rate"
    value: float  # the concurrency, or the requests per second
    warmup: int  # warm-up requests (0: none)
    requests: int  # measured requests
    timeout_s: float

    @property
    def streams(self) -> int:
        """Sessions the level holds: its concurrency, or an open loop's most in flight."""
        return int(self.value) if self.mode == "concurrency" else MAX_INFLIGHT


@dataclass
class ClientRun:
    """How a level's client ran: its processes' CPU and wall time over the measured phase, and why
    that many."""

    workers: list[WorkerRun] = field(default_factory=list)
    decided: str = ""
    warmup_load_cores: float | None = None

    @property
    def load_cores(self) -> float:
        return sum(w.cpu_ns / w.wall_ns for w in self.workers if w.wall_ns)


def available_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def workers_for(load_cores: float) -> int:
    """Processes for a client load (cores): one per CORE_SHARE, at most the cores available."""
    return max(1, min(available_cores(), math.ceil(load_cores / CORE_SHARE - 1e-9)))


class Sweep:
    """Runs levels one after another; `records` and `by_level` fill as phases finish (or stop),
    `clients` per level."""

    def __init__(
        self,
        ep: Endpoint,
        make_jobs: JobMaker,
        workers: int | None,
        progress: PhaseProgress,
        records: list[RequestRecord],
        by_level: dict[str, list[RequestRecord]],
        log: Callable[[str], None],
    ) -> None:
        self.ep, self.make_jobs, self.fixed, self.progress, self.log = (
            ep,
            make_jobs,
            workers,
            progress,
            log,
        )
        self.records, self.by_level = records, by_level
        self.clients: dict[str, ClientRun] = {}
        self._prior: tuple[float, int] | None = None  # (load in cores, streams) of the last level

    def run(self, spec: LevelSpec) -> None:
        if self.fixed is not None:
            n = self.fixed
            run = (
                self._in_process(spec, f"--workers {n}", None)
                if n == 1
                else self._sharded(spec, n, f"--workers {n}", 0)
            )
        else:
            run = self._in_process(spec, "auto", self._expected())
        self.clients[spec.label] = run
        self._prior = (run.load_cores, spec.streams)

    def _expected(self) -> Callable[[LevelSpec], float] | None:
        """The load a level would put on one process, scaled from the previous level's load per
        stream (an upper bound: the CPU per token falls as more streams share each pass of the
        stream loop)."""
        prior = self._prior
        if prior is None or prior[0] <= 0:
            return None
        return lambda spec: prior[0] * spec.streams / max(1, prior[1])

    # -- one process
    # ---------------------------------------------------------------------------------------------
    def _in_process(
        self, spec: LevelSpec, why: str, expected: Callable[[LevelSpec], float] | None
    ) -> ClientRun:
        """The level in this process; with `--workers auto` (why == "auto") its warm-up measures the
        load, and over CORE_SHARE the measured phase moves to worker processes. A warm-up that
        saturated this process cannot show how much more it needed: then the previous level's scaled
        load counts too."""
        pool = SessionPool(session_factory(self.ep), spec.streams)
        try:
            load = None
            if spec.warmup:
                # one-off costs (a protocol's first import) are not the level's load
                pool.give_back(pool.borrow())
                cpu0, wall0 = time.process_time_ns(), time.perf_counter_ns()
                self._phase(
                    spec, "warmup", self.make_jobs(spec.label, "warmup", 0, spec.warmup), pool
                )
                load = (time.process_time_ns() - cpu0) / max(1, time.perf_counter_ns() - wall0)
            if why == "auto":
                n, why = self._decide(spec, load, expected)
                if n > 1:
                    pool.close()
                    self.log(f"bench {spec.label}: {why}: measuring on {n} worker processes")
                    return self._sharded(spec, n, why, spec.warmup, load)
            cpu0, wall0 = time.process_time_ns(), time.perf_counter_ns()
            self._phase(
                spec, "latency", self.make_jobs(spec.label, "latency", 0, spec.requests), pool
            )
            worker = WorkerRun(
                0,
                os.getpid(),
                spec.streams,
                time.process_time_ns() - cpu0,
                time.perf_counter_ns() - wall0,
            )
            return ClientRun([worker], why, load)
        finally:
            pool.close()

    def _decide(
        self, spec: LevelSpec, load: float | None, expected: Callable[[LevelSpec], float] | None
    ) -> tuple[int, str]:
        scaled = expected(spec) if expected is not None else None
        if load is None:
            if scaled is None:
                return 1, "auto: no warm-up to measure, one process"
            return workers_for(
                scaled
            ), f"auto: {scaled:.2f} cores expected from the previous level's load per stream"
        n = workers_for(load)
        why = (
            f"auto: the warm-up in one process used {load:.2f} cores, "
            f"{'over' if n > 1 else 'within'} {CORE_SHARE:g} a process"
        )
        if load >= SATURATED and scaled is not None and workers_for(scaled) > n:
            n = workers_for(scaled)
            why += (
                f", saturated; {scaled:.2f} cores expected from the previous level's load per "
                "stream"
            )
        return n, why

    def _phase(self, spec: LevelSpec, phase: str, jobs: list[Job], pool: SessionPool) -> None:
        done = self.progress(f"{phase} {spec.label}", len(jobs))
        try:
            if spec.mode == "concurrency":
                recs = run_concurrency(pool, jobs, spec.streams, spec.timeout_s, done)
            else:
                recs = run_rate(pool, jobs, spec.value, spec.timeout_s, on_done=done)
        except Interrupted as stop:
            self._keep(spec, phase, stop.records)
            raise
        self._keep(spec, phase, recs)

    def _keep(self, spec: LevelSpec, phase: str, recs: list[RequestRecord]) -> None:
        self.records.extend(recs)
        if phase == "latency":
            self.by_level[spec.label] = recs

    # -- worker processes
    # ----------------------------------------------------------------------------------------
    def _sharded(
        self, spec: LevelSpec, n: int, why: str, first_warm: int, warmup_load: float | None = None
    ) -> ClientRun:
        """Each worker warms up its own streams (one request each at least), then all measure from
        the same instant."""
        rate = spec.value if spec.mode == "rate" else None
        warm = self.make_jobs(spec.label, "warmup", first_warm, spec.warmup)
        measured = self.make_jobs(spec.label, "latency", 0, spec.requests)
        shards = split(warm, measured, spec.streams, n, rate)
        fleet = Fleet(self.ep, shards, spec.timeout_s)
        try:
            for phase, jobs, step in (
                ("warmup", warm, fleet.warmup),
                ("latency", measured, fleet.measure),
            ):
                if not jobs:
                    continue
                done = self.progress(f"{phase} {spec.label} ({len(shards)} workers)", len(jobs))
                try:
                    self._keep(spec, phase, step(done))
                except Interrupted as stop:
                    self._keep(spec, phase, stop.records)
                    raise
        finally:
            fleet.close()
        return ClientRun([link.run for link in fleet.links], why, warmup_load)


# --------------------------------------------------------------------------------------------------
# The client's own cost, for results.json


def _lag(records: Sequence[RequestRecord]) -> dict[str, Any]:
    lags = [v / 1e3 for r in records for v in r.client_lag_us]
    stats = summarize(lags)
    return {
        "unit": "ms",
        "p50": stats.get("p50"),
        "p99": stats.get("p99"),
        "max": stats.get("max"),
        "count": len(lags),
    }


def client_summary(run: ClientRun, records: Sequence[RequestRecord]) -> dict[str, Any]:
    """levels[label]["client"]: processes, their CPU per streamed token and share of a core over the
    measured phase, and the client's own lag (how long bytes already received waited for the client
    to read them)."""
    per_worker: list[dict[str, Any]] = []
    for w in run.workers:
        mine = [r for r in records if r.client_worker == w.index]
        tokens = sum(r.output_tokens() for r in mine if r.ok)
        per_worker.append(
            {
                "worker": w.index,
                "pid": w.pid,
                "streams": w.streams,
                "requests": len(mine),
                "output_tokens": tokens,
                "cpu_seconds": w.cpu_ns / 1e9,
                "cpu_cores": w.cpu_ns / w.wall_ns if w.wall_ns else None,
                "cpu_us_per_token": w.cpu_ns / tokens / 1e3 if tokens else None,
                "lag_ms": _lag(mine),
            }
        )
    tokens = sum(p["output_tokens"] for p in per_worker)
    cpu_ns = sum(w.cpu_ns for w in run.workers)
    out: dict[str, Any] = {
        "workers": len(run.workers),
        "decided": run.decided,
        "core_share": CORE_SHARE,
        "warmup_load_cores": run.warmup_load_cores,
        "cpu_cores": run.load_cores,
        "cpu_us_per_token": cpu_ns / tokens / 1e3 if tokens else None,
        "lag_ms": _lag(records),
        "per_worker": per_worker,
    }
    busy = [p for p in per_worker if (p["cpu_cores"] or 0) >= SATURATED]
    itl = statistics.median(
        [v for r in records if r.ok and (v := r.itl_ms()) is not None] or [math.nan]
    )
    lag_p99 = out["lag_ms"]["p99"]
    more = max(len(run.workers), workers_for(run.load_cores)) + 1
    if busy:
        out["warning"] = (
            f"client process {busy[0]['worker']} used {busy[0]['cpu_cores']:.2f} of a core: the "
            f"client may have held this level back; rerun with --workers {more} or more"
        )
    elif lag_p99 is not None and itl > 0 and lag_p99 > LAG_SHARE * itl:
        out["warning"] = (
            f"the client's own lag p99 {lag_p99:.1f} ms is {lag_p99 / itl:.0%} of the ITL p50 "
            f"({itl:.1f} ms): its ITL and TTFT carry up to that much of its own delay (a busy or "
            f"shared client machine); rerun with --workers {more}, or on a machine of its own"
        )
    return out
