"""Load generation: a closed loop at fixed concurrency, or an open loop at a fixed request rate.

Each worker thread owns one session (one request in flight). Ctrl-C stops issuing, marks what was in flight as
cancelled and returns what has been measured; the caller writes partial results.
"""

from __future__ import annotations

import copy
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from trtkv.bench.client import SamplingParams, Session, now_ns
from trtkv.bench.records import CANCELLED, ERROR, NOT_SENT, RequestRecord


@dataclass
class Job:
    record: RequestRecord
    prompt: str
    params: SamplingParams


class Interrupted(Exception):
    """Ctrl-C during a run: the records so far are kept (in `records`)."""

    def __init__(self, records: list[RequestRecord]) -> None:
        super().__init__("interrupted")
        self.records = records


def _run_job(session: Session | None, job: Job, timeout_s: float, on_done: Callable[[RequestRecord], None]) -> None:
    if session is None:
        job.record.status, job.record.end_ns = ERROR, now_ns()
    else:
        try:
            session.run(job.record, job.prompt, job.params, timeout_s)
        except Exception as exc:  # noqa: BLE001 - counted as a failed request, never dropped
            job.record.status, job.record.error, job.record.end_ns = ERROR, f"{type(exc).__name__}: {exc}", now_ns()
    on_done(job.record)


def _open(factory: Callable[[], Session], errors: list[str]) -> Session | None:
    try:
        return factory()
    except Exception as exc:  # noqa: BLE001 - reported with the requests this worker would have sent
        errors.append(f"{type(exc).__name__}: {exc}")
        return None


def run_concurrency(factory: Callable[[], Session], jobs: Sequence[Job], concurrency: int, timeout_s: float,
                    on_done: Callable[[RequestRecord], None] = lambda r: None) -> list[RequestRecord]:
    """Closed loop: `concurrency` workers, each sending its next job as soon as the previous one finished."""
    todo: queue.Queue[Job] = queue.Queue()
    for job in jobs:
        todo.put(job)
    stop = threading.Event()
    errors: list[str] = []

    def worker() -> None:
        session = _open(factory, errors)
        try:
            while not stop.is_set():
                try:
                    job = todo.get_nowait()
                except queue.Empty:
                    return
                if session is None:
                    job.record.error = f"could not open a session: {errors[-1] if errors else '?'}"
                _run_job(session, job, timeout_s, on_done)
        finally:
            if session is not None:
                session.close()

    threads = [threading.Thread(target=worker, daemon=True, name=f"bench-worker-{i}") for i in range(concurrency)]
    _start_and_join(threads, stop, jobs)
    return [j.record for j in jobs]


def run_rate(factory: Callable[[], Session], jobs: Sequence[Job], rate_per_s: float, timeout_s: float,
             max_inflight: int = 64, on_done: Callable[[RequestRecord], None] = lambda r: None) -> list[RequestRecord]:
    """Open loop: job i is sent at start + i/rate (constant interval); up to `max_inflight` sessions.

    When every session is busy a job waits for one, so its send time slips; the lag is visible in the records."""
    idle: queue.Queue[Session | None] = queue.Queue()
    stop = threading.Event()
    errors: list[str] = []
    sessions: list[Session] = []
    lock = threading.Lock()

    def borrow() -> Session | None:
        try:
            return idle.get_nowait()
        except queue.Empty:
            pass
        with lock:
            if len(sessions) < max_inflight:
                session = _open(factory, errors)
                if session is not None:
                    sessions.append(session)
                return session
        return idle.get()

    def fire(job: Job) -> None:
        session = borrow()
        try:
            _run_job(session, job, timeout_s, on_done)
        finally:
            idle.put(session)

    threads: list[threading.Thread] = []
    start = time.perf_counter()
    try:
        for i, job in enumerate(jobs):
            delay = start + i / rate_per_s - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            t = threading.Thread(target=fire, args=(job,), daemon=True)
            t.start()
            threads.append(t)
        _start_and_join([], stop, jobs, threads)
    except KeyboardInterrupt:
        _cancel_unsent(jobs)
        raise Interrupted(copy.deepcopy([j.record for j in jobs])) from None
    finally:
        for s in sessions:
            s.close()
    return [j.record for j in jobs]


def _start_and_join(threads: list[threading.Thread], stop: threading.Event, jobs: Sequence[Job],
                    running: list[threading.Thread] | None = None) -> None:
    for t in threads:
        t.start()
    waiting = list(threads) + list(running or [])
    try:
        for t in waiting:
            while t.is_alive():
                t.join(timeout=0.2)
    except KeyboardInterrupt:
        stop.set()
        _cancel_unsent(jobs)
        raise Interrupted(copy.deepcopy([j.record for j in jobs])) from None


def _cancel_unsent(jobs: Sequence[Job]) -> None:
    t = now_ns()
    for job in jobs:
        if job.record.status == "pending":
            sent = job.record.send_ns > 0
            job.record.status, job.record.end_ns = (CANCELLED, t) if sent else (NOT_SENT, None)
            job.record.error = job.record.error or "interrupted (Ctrl-C)"
