"""A keyed OpenAI server (as the deploy files key vLLM): `trtkv bench` sends TRTKV_API_KEY and writes it nowhere."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.openai_replay import start
from trtkv.bench.runner import BenchOptions, run_bench
from trtkv.core.errors import TrtkvError
from trtkv.recipe import load_recipe

KEY = "sentinel-" + secrets.token_hex(8)
SMALL = ["bench.concurrency=[1]", "bench.num_requests=2", "bench.warmup_requests=1", "bench.input_tokens=16",
         "bench.output_tokens=4", "bench.thresholds=[]"]


@pytest.fixture(scope="module")
def keyed() -> Iterator[int]:
    proc, port = start(first_ms=5.0, gap_ms=1.0, api_key=KEY)
    try:
        yield port
    finally:
        proc.terminate()
        proc.join()


def _bench(port: int, out: Path) -> int:
    recipe = load_recipe("smollm2_fp8kv", SMALL)
    opts = BenchOptions(url=f"127.0.0.1:{port}", protocol="openai", tasks=[], output=out, progress=False)
    return run_bench(recipe, opts).exit_code


@pytest.mark.e2e  # runs the real model: not in `make check`
def test_bench_sends_the_key_and_writes_it_nowhere(keyed: int, tmp_path: Path, smollm2_dir: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRTKV_API_KEY", KEY)
    assert _bench(keyed, tmp_path / "bench") == 0
    files = [p for p in (tmp_path / "bench").rglob("*") if p.is_file()]
    assert files and not [p for p in files if KEY.encode() in p.read_bytes()]


def test_without_the_key_the_bench_fails(keyed: int, tmp_path: Path, smollm2_dir: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRTKV_API_KEY", raising=False)
    try:
        code = _bench(keyed, tmp_path / "bench")
    except TrtkvError as exc:  # refused at the endpoint check (GET /v1/models answers 401)
        assert "401" in str(exc), exc
    else:
        assert code != 0
