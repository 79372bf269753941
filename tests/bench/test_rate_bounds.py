"""The open loop's fan-out is bounded (issue 48): against a saturated server the request-rate mode runs on at most
its cap of worker threads (it started one thread per request: 2,373 in 12 s), and the requests no worker could take at
their time are counted as delayed (perf_analyzer's "Delayed Request Count"). Against a local socket server whose every
answer takes 0.3 s."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tests.bench.test_stream import OPENAI_BODY, SSE_HEAD, ScriptedServer, _answer, _openai
from trtkv.bench.load.loadgen import Job, run_rate
from trtkv.bench.transport.client import SamplingParams
from trtkv.contracts.bench_doc import OK, RequestRecord
from trtkv.measures.metrics import summarize_level


@pytest.fixture
def slow() -> Iterator[ScriptedServer]:
    def script(conn: socket.socket, n: int) -> bool:
        time.sleep(0.3)
        _answer(conn, SSE_HEAD + OPENAI_BODY)
        return True

    server = ScriptedServer(script)
    yield server
    server.close()


def test_the_request_rate_mode_runs_on_a_bounded_pool_and_counts_delayed_requests(slow: ScriptedServer) -> None:
    jobs = [Job(RequestRecord(f"r{i}", "latency", "rate=100/s", i, 4, 4), "The capital of France",
                SamplingParams(max_tokens=4)) for i in range(40)]
    def client_threads() -> int:  # the local server's own threads (one per connection) and the watcher left out
        return sum(not t.name.endswith(("(_serve)", "(_accept)", "(watch)")) for t in threading.enumerate())

    base = client_threads()
    peak = [base]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], client_threads())
            time.sleep(0.005)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        records = run_rate(lambda: _openai(slow), jobs, 100.0, 10.0, max_inflight=4)
    finally:
        done.set()
        watcher.join()
    assert [r.status for r in records] == [OK] * 40
    # the stream loop (started once per process) and 4 workers at most
    assert peak[0] - base <= 1 + 4, peak[0] - base
    counts = summarize_level(records)["request_count"]
    # 4 at a time, 0.3 s each: about 1.3 requests per 100 ms against 10 asked, so every request after the first 4
    # waits for a worker (36); on a loaded machine one of the first 4 may also miss its time by the 10 ms tolerance
    assert 36 <= counts["delayed"] <= 40 and records[-1].delayed, counts
    assert RequestRecord.from_doc(records[-1].to_doc()).delayed is True
