"""tests/support/openai_replay.py, the no-model OpenAI server the client cross-checks measure against, speaks what
trtkv's OpenAI client expects: /v1/models, max_tokens streamed chunks, the usage chunk, [DONE]."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.openai_replay import MODEL, start
from trtkv.bench.load.loadgen import Job, run_concurrency
from trtkv.bench.transport.client import Endpoint, SamplingParams
from trtkv.bench.transport.openai import OpenAISession, check_openai
from trtkv.contracts.bench_doc import RequestRecord


@pytest.fixture(scope="module")
def replay() -> Iterator[Endpoint]:
    proc, port = start(first_ms=20.0, gap_ms=2.0)
    try:
        yield Endpoint(f"127.0.0.1:{port}", "openai", "")
    finally:
        proc.terminate()
        proc.join()


def test_the_replay_server_streams_max_tokens_chunks_and_the_usage(replay: Endpoint) -> None:
    ep = check_openai(replay, 10.0)
    assert ep.model == MODEL
    jobs = [Job(RequestRecord(f"r{i}", "latency", "replay", i, 1, 5 + i), "hi", SamplingParams(max_tokens=5 + i))
            for i in range(4)]
    records = run_concurrency(lambda: OpenAISession(ep), jobs, 2, 30.0)
    assert all(r.ok for r in records), [r.error for r in records]
    assert sorted(len(r.response_texts) for r in records) == [5, 6, 7, 8]
    assert sorted(r.server_tokens or 0 for r in records) == [5, 6, 7, 8]
    assert all("".join(r.response_texts) == " the" * len(r.response_texts) for r in records)


def test_the_replay_server_sets_tcp_nodelay_and_keeps_its_timetable() -> None:
    """Nagle off (as uvicorn under vLLM: asyncio sets TCP_NODELAY), so no first token waits for the ACK of the
    headers; and its own lateness against the timetable is reported, to tell it from the client's."""
    import http.client
    import json
    import socket
    import threading

    from tests.support.openai_replay import ReplayServer, stats

    server = ReplayServer(0.0, 0.002, default_tokens=4)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)  # kept open to be looked at
    try:
        conn.request("POST", "/v1/completions", json.dumps({"model": MODEL, "prompt": "hi", "stream": True}),
                     {"Content-Type": "application/json"})
        body = conn.getresponse().read()
        assert body.count(b'"text": " the"') == 4 and body.endswith(b"data: [DONE]\n\n")
        accepted = [key.data.sock for key in list(server.sel.get_map().values()) if key.data is not None]
        assert accepted and all(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) for s in accepted)
    finally:
        conn.close()
    seen = stats(server.port)
    assert seen["events"] == 4 and 0 <= seen["late_ms"]["p50"] <= seen["late_ms"]["max"] < 1000
