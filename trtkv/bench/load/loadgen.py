"""Load generation: a closed loop at fixed concurrency, or an open loop at a fixed request rate.

Each worker thread holds one session (one request in flight) from a SessionPool, which a caller
keeps across the phases of a level so that the measured requests go over the warm-up's connections.
Ctrl-C (or a `tick` that says stop: a worker process told by its parent) stops issuing, marks what
was in flight as cancelled and returns what has been measured; the caller writes partial results.
"""

from __future__ import annotations

import copy
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from trtkv.bench.transport.client import SamplingParams, Session
from trtkv.contracts.bench_doc import CANCELLED, ERROR, NOT_SENT, RequestRecord, now_ns


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


def _run_job(
    pool: SessionPool,
    session: Session | None,
    job: Job,
    timeout_s: float,
    on_done: Callable[[RequestRecord], None],
) -> None:
    if session is None:
        job.record.error = f"could not open a session: {pool.errors[-1] if pool.errors else '?'}"
        job.record.status, job.record.end_ns = ERROR, now_ns()
    else:
        try:
            session.run(job.record, job.prompt, job.params, timeout_s)
        except Exception as exc:  # noqa: BLE001 - counted as a failed request, never dropped
            job.record.status, job.record.error, job.record.end_ns = (
                ERROR,
                f"{type(exc).__name__}: {exc}",
                now_ns(),
            )
    on_done(job.record)


def _open(factory: Callable[[], Session], errors: list[str]) -> Session | None:
    try:
        return factory()
    except Exception as exc:  # noqa: BLE001 - reported with the requests this worker would have sent
        errors.append(f"{type(exc).__name__}: {exc}")
        return None


class SessionPool:
    """The sessions of one level, up to `limit`: opened as the first requests need them, kept
    between phases (the warm-up's connections carry the measured requests, so the measured phase
    opens none), closed by `close`.

    Against vLLM (uvicorn's listen backlog of 2048) a storm of new connections is cheap, but behind
    a load balancer, a TLS proxy or a server with a small backlog every connect costs a handshake,
    and a dropped SYN is retried by the kernel one second later: a measured first token would carry
    it."""

    def __init__(self, factory: Callable[[], Session], limit: int) -> None:
        self.factory, self.limit = factory, max(1, limit)
        self.errors: list[str] = []
        self._idle: queue.SimpleQueue[Session] = queue.SimpleQueue()
        self._all: list[Session] = []
        self._lock = threading.Lock()

    @property
    def opened(self) -> int:
        return len(self._all)

    def borrow(self) -> Session | None:
        """An idle session, else a new one while under the limit (None when it could not be opened,
        the reason in `errors`), else wait for one to come back."""
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            pass
        with self._lock:
            if len(self._all) < self.limit:
                session = _open(self.factory, self.errors)
                if session is not None:
                    self._all.append(session)
                return session
        return self._idle.get()

    def give_back(self, session: Session | None) -> None:
        if session is not None:
            self._idle.put(session)

    def close(self) -> None:
        with self._lock:
            sessions, self._all = self._all, []
        for session in sessions:
            try:
                session.close()
            except Exception:  # noqa: BLE001,S110 - closing the rest matters more than one close that failed
                pass
        while True:
            try:
                self._idle.get_nowait()
            except queue.Empty:
                return


Sessions = SessionPool | Callable[[], Session]
TICK_S = 0.2
# an open loop's sessions and worker threads: a job that finds them all busy waits (its send time
# slips)
MAX_INFLIGHT = 64
# a job handed to a worker later than this after its send time is `delayed` (well above the
# dispatcher's own timer slack, far below any first-token time measured)
DELAY_TOLERANCE_S = 0.01
# called about every TICK_S while a run waits; True stops it as Ctrl-C does
Tick = Callable[[], bool]


def _pool(sessions: Sessions, limit: int) -> tuple[SessionPool, bool]:
    """(the pool, whether this run owns it and closes it at the end)."""
    return (
        (sessions, False)
        if isinstance(sessions, SessionPool)
        else (SessionPool(sessions, limit), True)
    )


def run_concurrency(
    sessions: Sessions,
    jobs: Sequence[Job],
    concurrency: int,
    timeout_s: float,
    on_done: Callable[[RequestRecord], None] = lambda r: None,
    tick: Tick | None = None,
) -> list[RequestRecord]:
    """Closed loop: `concurrency` workers, each sending its next job as soon as the previous one
    finished.

    `sessions`: a SessionPool kept by the caller across phases, or a factory (a pool for this run
    only). Worker i sends job i first, so a warm-up of at least `concurrency` jobs carries a request
    on every session of the pool."""
    pool, owned = _pool(sessions, concurrency)
    todo: queue.SimpleQueue[Job] = queue.SimpleQueue()
    for job in jobs[concurrency:]:
        todo.put(job)
    stop = threading.Event()

    def worker(first: Job | None) -> None:
        session = pool.borrow()
        try:
            job = first
            while job is not None and not stop.is_set():
                _run_job(pool, session, job, timeout_s, on_done)
                try:
                    job = todo.get_nowait()
                except queue.Empty:
                    job = None
        finally:
            pool.give_back(session)

    firsts = list(jobs[:concurrency])
    threads = [
        threading.Thread(target=worker, args=(first,), daemon=True, name=f"bench-worker-{i}")
        for i, first in enumerate(firsts)
    ]
    try:
        _start_and_join(threads, stop, jobs, tick=tick)
    finally:
        if owned:
            pool.close()
    return [j.record for j in jobs]


def run_rate(
    sessions: Sessions,
    jobs: Sequence[Job],
    rate_per_s: float,
    timeout_s: float,
    max_inflight: int = MAX_INFLIGHT,
    on_done: Callable[[RequestRecord], None] = lambda r: None,
    tick: Tick | None = None,
    start: float | None = None,
    send_at_s: Sequence[float] | None = None,
) -> list[RequestRecord]:
    """Open loop: job i is sent at start + i/rate (or start + send_at_s[i]; start: a perf_counter()
    time, default now) by a fixed pool of worker threads, one per session: up to `max_inflight`
    (the pool's limit when a pool is given), never one thread per request.

    When every worker is busy a job waits for one, so its send time slips; a job handed to a worker
    more than DELAY_TOLERANCE_S after its time is marked `delayed` (perf_analyzer's "Delayed Request
    Count", the requests that missed their schedule; GenAI-Perf and AIPerf cap the requests in
    flight likewise)."""
    pool, owned = _pool(sessions, max_inflight)
    stop = threading.Event()
    todo: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
    free = threading.Semaphore(pool.limit)

    def fire(job: Job) -> None:
        session = pool.borrow()
        try:
            _run_job(pool, session, job, timeout_s, on_done)
        finally:
            pool.give_back(session)

    def worker() -> None:
        while (job := todo.get()) is not None:
            try:
                if not stop.is_set():
                    fire(job)
            finally:
                free.release()

    threads = [
        threading.Thread(target=worker, daemon=True, name=f"bench-rate-{i}")
        for i in range(min(pool.limit, len(jobs)))
    ]
    for t in threads:
        t.start()
    t0 = time.perf_counter() if start is None else start
    offsets = send_at_s if send_at_s is not None else [i / rate_per_s for i in range(len(jobs))]
    next_tick = time.perf_counter() + TICK_S
    try:
        for job, offset in zip(jobs, offsets, strict=True):
            next_tick = _sleep_until(t0 + offset, tick, next_tick)
            next_tick = _acquire(free, tick, next_tick)
            job.record.delayed = time.perf_counter() - (t0 + offset) > DELAY_TOLERANCE_S
            todo.put(job)
        for _ in threads:
            todo.put(None)
        _start_and_join([], stop, jobs, threads, tick=tick)
    except KeyboardInterrupt:
        stop.set()
        cancel_unsent(jobs)
        raise Interrupted(copy.deepcopy([j.record for j in jobs])) from None
    finally:
        stop.set()  # workers still waiting for a job end (their None is queued, or this one)
        for _ in threads:
            todo.put(None)
        if owned:
            pool.close()
    return [j.record for j in jobs]


def _acquire(free: threading.Semaphore, tick: Tick | None, next_tick: float) -> float:
    """Wait for a free worker, calling `tick` every TICK_S (KeyboardInterrupt when it says stop)."""
    while not free.acquire(timeout=TICK_S):
        now = time.perf_counter()
        if tick is not None and now >= next_tick:
            next_tick = now + TICK_S
            if tick():
                raise KeyboardInterrupt
    return next_tick


def _sleep_until(when: float, tick: Tick | None, next_tick: float) -> float:
    """Sleep until perf_counter() reaches `when`, calling `tick` every TICK_S (KeyboardInterrupt
    when it says stop); returns when the next tick is due."""
    while True:
        now = time.perf_counter()
        if tick is not None and now >= next_tick:
            next_tick = now + TICK_S
            if tick():
                raise KeyboardInterrupt
        if now >= when:
            return next_tick
        time.sleep(min(when - now, TICK_S) if tick is not None else when - now)


def _start_and_join(
    threads: list[threading.Thread],
    stop: threading.Event,
    jobs: Sequence[Job],
    running: list[threading.Thread] | None = None,
    tick: Tick | None = None,
) -> None:
    for t in threads:
        t.start()
    waiting = list(threads) + list(running or [])
    try:
        for t in waiting:
            while t.is_alive():
                t.join(timeout=TICK_S)
                if tick is not None and tick():
                    raise KeyboardInterrupt
    except KeyboardInterrupt:
        stop.set()
        cancel_unsent(jobs)
        raise Interrupted(copy.deepcopy([j.record for j in jobs])) from None


def cancel_unsent(jobs: Sequence[Job]) -> None:
    """Ctrl-C: a request in flight is cancelled (its partial response kept), one not sent yet is
    marked so."""
    t = now_ns()
    for job in jobs:
        if job.record.status == "pending":
            sent = job.record.send_ns > 0
            job.record.status, job.record.end_ns = (CANCELLED, t) if sent else (NOT_SENT, None)
            job.record.error = job.record.error or "interrupted (Ctrl-C)"
