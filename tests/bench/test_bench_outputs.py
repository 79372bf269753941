"""What a `trtkv bench` run leaves (issue 48): an interrupted rerun never replaces the last complete results (its
partial results go to `<output>.partial/`), a folder there that trtkv did not write is refused before measuring, and
the served-pool shortfall warning reaches results.json and the console. Against the deterministic OpenAI replay
server (tests/support/openai_replay.py) and the real tokenizer."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.openai_replay import start
from trtkv.bench import runner
from trtkv.bench.runner import BenchOptions, run_bench
from trtkv.cli.bench import served_side
from trtkv.core.errors import StageError
from trtkv.recipe import load_recipe

SMALL = ["bench.concurrency=[1]", "bench.num_requests=2", "bench.warmup_requests=1", "bench.input_tokens=16",
         "bench.output_tokens=4", "bench.thresholds=[]"]


@pytest.fixture(scope="module")
def replay() -> Iterator[int]:
    proc, port = start(first_ms=2.0, gap_ms=1.0)
    try:
        yield port
    finally:
        proc.terminate()
        proc.join()


def _bench(port: int, out: Path) -> runner.BenchOutcome:
    opts = BenchOptions(url=f"127.0.0.1:{port}", protocol="openai", tasks=[], output=out, progress=False)
    return run_bench(load_recipe("smollm2_fp8kv", SMALL), opts, served_side())


def _results(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "results.json").read_text())


def test_an_interrupted_rerun_keeps_the_complete_results(replay: int, tmp_path: Path, smollm2_dir: Path,
                                                         engines_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: Ctrl-C during a rerun replaced the complete results.json (and every file beside it) with partial ones."""
    out = tmp_path / "out"
    first = _bench(replay, out)
    assert first.exit_code == 0 and first.output == out
    complete = (out / "results.json").read_bytes()
    assert _results(out)["partial"] is False

    def ctrl_c(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt  # what the latency sweep sees when the user presses Ctrl-C

    monkeypatch.setattr(runner, "run_latency", ctrl_c)
    second = _bench(replay, out)
    assert second.exit_code == runner.EXIT_INTERRUPTED
    assert (out / "results.json").read_bytes() == complete  # untouched
    partial = tmp_path / "out.partial"
    assert second.output == partial and _results(partial)["partial"] is True
    assert _results(partial)["interrupted_during"] == "latency sweep"


def test_a_partial_folder_trtkv_did_not_write_is_refused_before_measuring(replay: int, tmp_path: Path,
                                                                          engines_tmp: Path) -> None:
    mine = tmp_path / "out.partial"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine\n")
    with pytest.raises(StageError, match=r"partial results folder .*out\.partial: it holds files trtkv did not write"):
        _bench(replay, tmp_path / "out")
    assert (mine / "notes.txt").read_text() == "mine\n" and not (tmp_path / "out").exists()


def test_the_pool_shortfall_warning_reaches_results_and_console(replay: int, tmp_path: Path, smollm2_dir: Path,
                                                                engines_tmp: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Before: the warning was appended in place to a field pydantic did not count as set, so results.json (written
    with exclude_unset) and the console summary (read from it) both lost it."""
    from trtkv.serving import pool

    warning = "the served KV pool (1.00 GiB per GPU, a test) is 50% below the plan's 2.00 GiB"
    shortfall = {"planned_bytes_per_gpu": 2 << 30, "served_bytes_per_gpu": 1 << 30, "served_tokens": 8,
                 "source": "a test", "served_over_planned": 0.5, "warning": warning, "rule": "test"}
    monkeypatch.setattr(pool, "compare", lambda recipe, server, planned: shortfall)
    out = tmp_path / "out"
    assert _bench(replay, out).exit_code == 0
    assert _results(out)["warnings"] == [warning]
    printed = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    assert f"warning: {warning}" in printed
