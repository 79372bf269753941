"""What a benchmark asks of the supervisor and what `trtkv status` sends (issue 48): a killed bench's quiet request
stops counting once its pid runs another process (the pid's start time is recorded and checked), and
`trtkv status --canaries 0` sends no inference."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from trtkv.cli import main
from trtkv.core import sessions
from trtkv.recipe import load_recipe
from trtkv.serving import health, supervisor_state


def test_a_quiet_request_whose_pid_was_reused_does_not_count(engines_tmp: Path) -> None:
    """Before: only the pid and the executable's name were checked, so a killed bench's request stayed in force for as
    long as any Python process held its pid, and the supervisor sent no canary for good. Here a live Python process
    stands in for the pid's new owner: a request recorded with another start time (the killed bench's) is removed."""
    recipe = load_recipe("smollm2_fp8kv")
    folder = supervisor_state.quiet_dir(recipe)
    folder.mkdir(parents=True)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        start = sessions.start_time(proc.pid)
        assert start is not None
        holder = {"pid": proc.pid, "command": [sys.executable], "who": "trtkv bench"}
        reused = folder / f"{proc.pid}.json"
        reused.write_text(json.dumps({**holder, "start_time": start - 1}))  # the killed bench started earlier
        assert supervisor_state.quiet_holders(recipe) == [] and not reused.exists()
        older = folder / "old.json"
        older.write_text(json.dumps(holder))  # no start time (an older trtkv): not proven, not counted
        assert supervisor_state.quiet_holders(recipe) == [] and not older.exists()
        for bad in ("12", True, None, [1]):  # a start time that is not an integer
            (folder / "bad.json").write_text(json.dumps({**holder, "start_time": bad}))
            assert supervisor_state.quiet_holders(recipe) == []
        live = folder / "live.json"
        live.write_text(json.dumps({**holder, "start_time": start}))
        assert [h["pid"] for h in supervisor_state.quiet_holders(recipe)] == [proc.pid] and live.exists()
    finally:
        proc.kill()
        proc.wait()
    assert supervisor_state.quiet_holders(recipe) == []


def test_quiet_records_the_start_time_of_its_process(engines_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The request `supervise.quiet` writes carries this process's start time, so the supervisor can prove it."""
    import os

    from trtkv.serving import supervise

    recipe = load_recipe("smollm2_fp8kv")
    seen: list[dict[str, Any]] = []
    monkeypatch.setattr(supervise, "alive", lambda r: object())
    monkeypatch.setattr("trtkv.contracts.artifacts.ServerRecord.load", lambda folder: _Server())
    with supervise.quiet(recipe, "trtkv bench", None) as asked:
        assert asked
        seen = supervisor_state.quiet_holders(recipe)
    assert [h["start_time"] for h in seen] == [sessions.start_time(os.getpid())]


class _Server:
    client_host = host = "127.0.0.1"
    http_port = grpc_port = 1


@pytest.mark.parametrize(("flag", "sent"), [(["--canaries", "0"], 0), (["--canaries", "3"], 3), ([], 1)])
def test_status_canaries_zero_means_none(engines_tmp: Path, monkeypatch: pytest.MonkeyPatch, flag: list[str],
                                         sent: int) -> None:
    """Before: `--canaries 0` was read as "not given" (`or`) and sent the default's inferences."""
    asked: list[int | None] = []

    def check(recipe: object, canaries: int | None = None, timeout_s: float = 60.0) -> health.Health:
        asked.append(canaries)
        return health.Health("absent", None)

    monkeypatch.setattr(health, "check", check)
    main(["status", "smollm2_fp8kv", *flag, "triton.instance_count=1"])
    assert asked == [sent]


@pytest.mark.parametrize("value", ["-1", "65"])
def test_status_canaries_out_of_range_is_one_error_line(engines_tmp: Path, capsys: pytest.CaptureFixture[str],
                                                        value: str) -> None:
    code = main(["status", "smollm2_fp8kv", "--canaries", value])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--canaries" in err[0] and "Traceback" not in err[0], err
