"""tests/support/openai_replay.py, the no-model OpenAI server the client cross-checks measure against, speaks what
trtkv's OpenAI client expects: /v1/models, max_tokens streamed chunks, the usage chunk, [DONE]."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.openai_replay import MODEL, start
from trtkv.bench.client import Endpoint, SamplingParams
from trtkv.bench.loadgen import Job, run_concurrency
from trtkv.bench.openai import OpenAISession, check_openai
from trtkv.bench.records import RequestRecord


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
