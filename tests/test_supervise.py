"""The supervisor's decisions (trtkv.supervise) with a scripted probe and a recording serve: a dead instance
restarts at once, a slow canary only twice in a row, restarts are bounded per window with growing back-off, and
every step is an event. The real thing (a killed stub on the real tritonserver) is the soak test in
tests/test_serve_e2e.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trtkv import serve, supervise
from trtkv.recipe import load_recipe


class Script:
    def __init__(self, states: list[tuple[str, str]]) -> None:
        self.states = list(states)

    def __call__(self) -> tuple[str, str]:
        return self.states.pop(0) if self.states else ("healthy", "")


@pytest.fixture()
def sup(engines_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[supervise.Supervisor, list[str]]:
    recipe = load_recipe("smollm2_fp8kv")
    calls: list[str] = []
    monkeypatch.setattr(serve, "stop", lambda r, **kw: calls.append("stop") or True)
    monkeypatch.setattr(serve, "start", lambda r, **kw: calls.append("start") or None)
    s = supervise.Supervisor(recipe, interval_s=0.0, failures=2, max_restarts=2, backoff_s=0.01, log=lambda _m: None)
    (engines_tmp / recipe.name / "serve").mkdir(parents=True)
    return s, calls


def events(s: supervise.Supervisor) -> list[dict[str, Any]]:
    return supervise.read_events(s.recipe, last=100)


def test_dead_instance_restarts_at_once_slow_canary_only_twice(sup: tuple[supervise.Supervisor, list[str]],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    s, calls = sup
    dead = ("dead", "Stub process 'tensorrt_llm_0_0' is not healthy.")
    slow = ("degraded", "TimeoutError: timed out")
    monkeypatch.setattr(s, "probe", Script([dead, ("healthy", ""), slow, ("healthy", ""), slow, slow]))
    assert s.run(rounds=6) == 0
    assert calls == ["stop", "start", "stop", "start"]  # the dead one at once; the slow one on its second miss
    kinds = [e["event"] for e in events(s)]
    assert kinds.count("restarting") == 2 and kinds.count("restarted") == 2
    restarting = [e for e in events(s) if e["event"] == "restarting"]
    assert [e["backoff_s"] for e in restarting] == [0.01, 0.02]  # doubling
    assert "is not healthy" in restarting[0]["cause"]
    record = json.loads(supervise.record_path(s.recipe).read_text())
    assert record["state"] == "healthy" and record["restarts"] == 2


def test_restarts_are_bounded_then_it_gives_up(sup: tuple[supervise.Supervisor, list[str]],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    s, calls = sup
    monkeypatch.setattr(s, "probe", Script([("down", "the server process exited")] * 5))
    assert s.run(rounds=5) == 1
    assert calls.count("start") == 2
    last = events(s)[-1]
    assert last["event"] == "gave_up" and last["restarts_in_window"] == 2
    assert json.loads(supervise.record_path(s.recipe).read_text())["state"] == "failed"
