"""Worker processes for one level of the latency sweep: the level's streams sharded over processes,
each with its own session pool, stream loop and GIL; every worker's records come back to the parent
with the CPU time it spent.

One duplex pipe per worker. The worker runs its warm-up and says ("warm", records); the parent
answers ("go", t) once every worker is warm, and each starts its measured phase at perf_counter() ==
t. perf_counter is CLOCK_MONOTONIC on Linux (and mach_absolute_time on macOS): one clock for the
whole machine, so the records of all workers share the parent's time axis and merge as they are. The
worker ends with ("done", records, cpu_ns, wall_ns); on the way it sends ("progress", n) and reads
("stop",), which ends it as Ctrl-C would ("stopped", records). Workers start with SIGINT blocked:
Ctrl-C in a terminal signals the whole process group, and the parent alone decides; it stops every
worker and takes what each measured, waiting STOP_GRACE_S at most. A worker that dies fails its
requests, never drops them.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from trtkv.bench.load.loadgen import (
    TICK_S,
    Interrupted,
    Job,
    SessionPool,
    cancel_unsent,
    run_concurrency,
    run_rate,
)
from trtkv.bench.transport.client import Endpoint
from trtkv.bench.transport.endpoints import session_factory
from trtkv.contracts.bench_doc import ERROR, NOT_SENT, RequestRecord, now_ns

# after Ctrl-C, how long the parent waits for the workers' records before killing them
STOP_GRACE_S = 1.0
# a worker that has not said it is warm within the warm-up's timeout plus this has failed
START_S = 30.0
# the measured phase starts this long after "go" is sent, in every worker at the same instant
GO_DELAY_S = 0.05


@dataclass
class Shard:
    """What one worker runs: its streams (closed loop: its concurrency; open loop: its sessions) and
    its jobs. Open loop: job j of the level is sent at start + j / rate, whichever worker carries it
    (`*_at_s`)."""

    index: int
    streams: int
    warmup: list[Job]
    measured: list[Job]
    rate: float | None = None
    warmup_at_s: list[float] | None = None
    measured_at_s: list[float] | None = None


@dataclass
class WorkerRun:
    """One process's part of a level: its measured phase's CPU time (user + system, every thread)
    and wall time."""

    index: int
    pid: int
    streams: int
    cpu_ns: int = 0
    wall_ns: int = 0


def split(
    warmup: Sequence[Job],
    measured: Sequence[Job],
    streams: int,
    workers: int,
    rate: float | None = None,
) -> list[Shard]:
    """Closed loop: the streams dealt round-robin (worker k gets slots k, k+n, ...), job i to the
    owner of slot i % streams; open loop: job i to worker i % n, sent at i / rate as in one process,
    the sessions split evenly."""
    n = max(1, min(workers, streams))
    shards = [
        Shard(
            k, len(range(k, streams, n)), [], [], rate, [] if rate else None, [] if rate else None
        )
        for k in range(n)
    ]
    for i, job in enumerate(warmup):
        owner = shards[i % n if rate else (i % streams) % n]
        owner.warmup.append(job)
        if owner.warmup_at_s is not None and rate:
            owner.warmup_at_s.append(i / rate)
    for i, job in enumerate(measured):
        owner = shards[i % n if rate else (i % streams) % n]
        owner.measured.append(job)
        if owner.measured_at_s is not None and rate:
            owner.measured_at_s.append(i / rate)
    for shard in shards:
        for job in shard.warmup + shard.measured:
            job.record.client_worker = shard.index
    return shards


def budget_s(shard: Shard, jobs: Sequence[Job], timeout_s: float) -> float:
    """How long a worker's phase can take when every request runs into its timeout (each is bounded
    by it, plus the stream loop's 5 s grace): past this, plus START_S, the worker has failed."""
    rounds = -(-len(jobs) // max(1, shard.streams))
    span = len(jobs) / shard.rate if shard.rate else 0.0
    return START_S + span + rounds * (timeout_s + 5.0)


# --------------------------------------------------------------------------------------------------
# The worker process


class _Worker:
    """The worker's side: its pool, its phases, and the tick that reports progress and reads the
    parent's word."""

    def __init__(
        self, conn: Connection, ep: Endpoint, shard: Shard, timeout_s: float, parent: int
    ) -> None:
        self.conn, self.ep, self.shard, self.timeout_s, self.parent = (
            conn,
            ep,
            shard,
            timeout_s,
            parent,
        )
        self.finished: list[int] = []
        self.reported = 0
        self.stop = False
        self.go_at: float | None = None

    def tick(self) -> bool:
        done = len(self.finished)
        try:
            if done > self.reported:
                self.conn.send(("progress", done - self.reported))
                self.reported = done
            while self.conn.poll():
                message = self.conn.recv()
                if message[0] == "stop":
                    self.stop = True
                elif message[0] == "go":
                    self.go_at = float(message[1])
        except (EOFError, OSError):  # the parent closed its end: nobody will read these records
            self.stop = True
        if os.getppid() != self.parent:  # the parent is gone
            self.stop = True
        return self.stop

    def phase(
        self, pool: SessionPool, jobs: list[Job], at_s: list[float] | None, start: float | None
    ) -> None:
        shard, done = self.shard, (lambda _r: self.finished.append(1))
        if not jobs:
            return
        if shard.rate:
            run_rate(
                pool,
                jobs,
                shard.rate,
                self.timeout_s,
                on_done=done,
                tick=self.tick,
                start=start,
                send_at_s=at_s,
            )
        else:
            run_concurrency(pool, jobs, shard.streams, self.timeout_s, done, tick=self.tick)

    def wait_for_go(self) -> float:
        while self.go_at is None:
            if self.tick():
                raise Interrupted([])
            try:
                self.conn.poll(TICK_S)
            except (EOFError, OSError):
                raise Interrupted([]) from None
        return self.go_at

    def run(self) -> None:
        shard = self.shard
        pool = SessionPool(session_factory(self.ep), shard.streams)
        phase = "warmup"
        try:
            self.phase(pool, shard.warmup, shard.warmup_at_s, None)
            self.tick()  # the warm-up's last progress before its records
            self.conn.send(("warm", [j.record for j in shard.warmup]))
            phase = "measured"
            start = self.wait_for_go()
            while time.perf_counter() < start:
                time.sleep(max(0.0, start - time.perf_counter()))
            cpu0, wall0 = time.process_time_ns(), time.perf_counter_ns()
            self.phase(pool, shard.measured, shard.measured_at_s, start)
            cpu, wall = time.process_time_ns() - cpu0, time.perf_counter_ns() - wall0
            self.tick()
            self.conn.send(("done", [j.record for j in shard.measured], cpu, wall))
        except Interrupted as stop:
            jobs = shard.warmup if phase == "warmup" else shard.measured
            cancel_unsent(jobs)
            try:
                self.conn.send(("stopped", stop.records or [j.record for j in jobs]))
            except OSError:
                pass  # the parent is gone
        finally:
            pool.close()


def worker_main(
    conn: Connection, ep: Endpoint, shard: Shard, timeout_s: float, parent: int
) -> None:
    """The worker process's entry point (multiprocessing, spawn)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _Worker(conn, ep, shard, timeout_s, parent).run()
    finally:
        conn.close()


# --------------------------------------------------------------------------------------------------
# The parent's side


@contextmanager
def _sigint_blocked() -> Iterator[None]:
    """SIGINT blocked while workers start (a child keeps the mask across exec), delivered to this
    process after."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(
        signal, "pthread_sigmask"
    ):
        yield
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


class _Link:
    """The parent's handle on one worker."""

    def __init__(self, shard: Shard, proc: Any, conn: Connection) -> None:
        self.shard, self.proc, self.conn = shard, proc, conn
        self.run = WorkerRun(shard.index, 0, shard.streams)
        self.reply: tuple[Any, ...] | None = None  # the last phase's final message
        self.dead = ""  # why it failed, when it did

    def failed(self, jobs: list[Job], error: str) -> list[RequestRecord]:
        """This worker's records of a phase it could not finish: failed, never dropped."""
        t = now_ns()
        for job in jobs:
            job.record.status, job.record.error, job.record.end_ns = ERROR, error, t
        return [j.record for j in jobs]


class Fleet:
    """The workers of one level: started by the constructor, then `warmup()`, `measure()`,
    `close()`."""

    def __init__(self, ep: Endpoint, shards: list[Shard], timeout_s: float) -> None:
        self.timeout_s = timeout_s
        # never fork: this process has threads (stream loop, progress)
        ctx = multiprocessing.get_context("spawn")
        self.links: list[_Link] = []
        try:
            with _sigint_blocked():
                for shard in shards:
                    mine, theirs = ctx.Pipe()
                    proc = ctx.Process(
                        target=worker_main,
                        args=(theirs, ep, shard, timeout_s, os.getpid()),
                        daemon=True,
                        name=f"trtkv-bench-worker-{shard.index}",
                    )
                    proc.start()
                    theirs.close()
                    link = _Link(shard, proc, mine)
                    link.run.pid = proc.pid or 0
                    self.links.append(link)
        except BaseException:
            self.close()  # the workers started so far: by their own pids
            raise

    def warmup(self, on_done: Callable[[Any], None]) -> list[RequestRecord]:
        budget = max(budget_s(k.shard, k.shard.warmup, self.timeout_s) for k in self.links)
        return self._phase("warm", "warmup", on_done, budget)

    def measure(self, on_done: Callable[[Any], None]) -> list[RequestRecord]:
        go = time.perf_counter() + GO_DELAY_S
        for link in self._live():
            _send(link, ("go", go))
        budget = max(budget_s(k.shard, k.shard.measured, self.timeout_s) for k in self.links)
        return self._phase("done", "measured", on_done, budget)

    def close(self) -> None:
        for link in self.links:
            if link.proc.is_alive():
                link.proc.kill()  # its own pid: a worker this level started
            link.proc.join(timeout=5)
            link.conn.close()

    def _live(self) -> list[_Link]:
        return [link for link in self.links if not link.dead]

    def _phase(
        self, final: str, phase: str, on_done: Callable[[Any], None], budget: float
    ) -> list[RequestRecord]:
        waiting = set(self._live())
        for link in waiting:
            link.reply = None
        deadline = time.monotonic() + budget
        try:
            while waiting:
                self._serve(waiting, final, on_done)
                if time.monotonic() > deadline:
                    for link in list(waiting):
                        link.dead = (
                            f"worker process {link.shard.index} did not finish its {phase} in time"
                        )
                        link.proc.kill()
                        waiting.discard(link)
        except KeyboardInterrupt:
            raise Interrupted(self._stop(waiting, phase)) from None
        return self._records(phase)

    def _serve(self, waiting: set[_Link], final: str, on_done: Callable[[Any], None]) -> None:
        """Read what the workers said (TICK_S at most); a worker whose process ended without its
        answer is dead."""
        by_handle: dict[Any, _Link] = {}
        for link in waiting:
            by_handle[link.conn] = link
            by_handle[link.proc.sentinel] = link
        for handle in wait(list(by_handle), timeout=TICK_S):
            link = by_handle[handle]
            if link not in waiting:
                continue
            try:
                while link.conn.poll():
                    message = link.conn.recv()
                    if message[0] == "progress":
                        for _ in range(int(message[1])):
                            on_done(None)
                    else:
                        link.reply = message
            except (EOFError, OSError):
                pass
            if link.reply is not None and link.reply[0] in (final, "stopped"):
                waiting.discard(link)
                if final == "done" and link.reply[0] == "done":
                    link.run.cpu_ns, link.run.wall_ns = int(link.reply[2]), int(link.reply[3])
            elif not link.proc.is_alive():
                link.proc.join(timeout=1)
                link.dead = (
                    f"worker process {link.shard.index} exited with code {link.proc.exitcode}"
                )
                waiting.discard(link)

    def _records(self, phase: str) -> list[RequestRecord]:
        """The phase's records from every worker (a dead worker's: failed), in the order the jobs
        were made."""
        out: list[RequestRecord] = []
        for link in self.links:
            jobs = link.shard.warmup if phase == "warmup" else link.shard.measured
            if (
                link.reply is not None
                and link.reply[0] in ("warm", "done", "stopped")
                and len(link.reply[1]) == len(jobs)
            ):
                out.extend(link.reply[1])
            else:
                out.extend(
                    link.failed(
                        jobs, link.dead or f"worker process {link.shard.index} sent no records"
                    )
                )
        for rec in out:
            if rec.status == "pending":  # a worker's record never finished (it was stopped or died)
                rec.status, rec.end_ns = NOT_SENT, None
        return sorted(out, key=_job_order)

    def _stop(self, waiting: set[_Link], phase: str) -> list[RequestRecord]:
        """Ctrl-C: every worker stops and sends what it measured; one that does not within
        STOP_GRACE_S is killed and its requests count as not sent."""
        for link in waiting:
            _send(link, ("stop",))
        deadline = time.monotonic() + STOP_GRACE_S
        while waiting and time.monotonic() < deadline:
            try:
                self._serve(waiting, "stopped", lambda _r: None)
            except KeyboardInterrupt:
                break
        for link in waiting:
            link.proc.kill()
            jobs = link.shard.warmup if phase == "warmup" else link.shard.measured
            for job in jobs:
                if job.record.status == "pending":
                    job.record.status, job.record.end_ns = NOT_SENT, None
                    job.record.error = (
                        "interrupted (Ctrl-C); its worker process sent no records in time"
                    )
            link.reply = ("stopped", [j.record for j in jobs])
        return self._records(phase)


def _send(link: _Link, message: tuple[Any, ...]) -> None:
    """A word to a worker; one whose pipe is broken has died (the sentinel says how, in _serve)."""
    try:
        link.conn.send(message)
    except OSError:
        pass


def _job_order(record: RequestRecord) -> tuple[str, int]:
    head, _, number = record.request_id.rpartition("-")
    return (head, int(number)) if number.isdigit() else (record.request_id, 0)
