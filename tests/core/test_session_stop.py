"""Ending a whole session (trtkv.core.sessions.stop_session) waits for every process of it, not only its leader
(issue 56: `trtkv stop` returned while a restarted vLLM server's EngineCore and Worker still ran): real `sleep`
children in a new session, one slow to exit after SIGTERM (as vLLM's EngineCore shuts its workers down), one that
ignores SIGTERM (SIGKILLed at the bound and named), and a listed pid whose start time changed, which is never
signalled. No server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from trtkv.core import sessions

# the leader exits at once on SIGTERM; its children: one that takes 1 s to exit after SIGTERM (its own `sleep`
# child with it) and one that ignores SIGTERM (`sleep` inherits the ignored signal)
SESSION = """
sh -c 'trap "sleep 1; exit 0" TERM; sleep 600 & echo $! > {dir}/slow_child; wait' &
echo $! > {dir}/slow
sh -c 'trap "" TERM; exec sleep 600' &
echo $! > {dir}/deaf
trap 'exit 0' TERM
wait
"""


def _live(pid: int) -> bool:
    found = sessions.stat(pid)
    return found is not None and found[0] not in ("Z", "X")


@pytest.fixture()
def session(tmp_path: Path) -> Iterator[dict[str, int]]:
    """A leader (sh) in a new session with its three `sleep`-running children; their pids by role."""
    proc = subprocess.Popen(["sh", "-c", SESSION.format(dir=tmp_path)], start_new_session=True)
    roles = ("slow", "slow_child", "deaf")
    deadline = time.monotonic() + 30
    while not all((tmp_path / r).is_file() and (tmp_path / r).read_text().strip() for r in roles):
        assert time.monotonic() < deadline, "the session's children did not start"
        time.sleep(0.02)
    pids = {"leader": proc.pid, **{r: int((tmp_path / r).read_text()) for r in roles}}
    while sessions.cmdline(pids["deaf"]) != ["sleep", "600"]:  # exec'd: its name is `sleep` from now on
        assert time.monotonic() < deadline
        time.sleep(0.02)
    yield pids
    for pid in pids.values():  # whatever a failed test left
        if _live(pid):
            os.kill(pid, signal.SIGKILL)
    proc.wait(10)


def test_stop_returns_only_when_every_process_of_the_session_is_gone(session: dict[str, int]) -> None:
    """The leader exits at once on SIGTERM; the others are waited for (the slow one ends by itself within the
    grace), the one that ignores SIGTERM is SIGKILLed at the bound and named; when stop_session returns, nothing of
    the session exists."""
    sid = session["leader"]
    assert sessions.in_session(sid) == sorted(session.values())
    said: list[str] = []
    start = time.monotonic()
    result = sessions.stop_session(sessions.Session(sid, sessions.start_time(sid)), grace_s=5, log=said.append)
    took = time.monotonic() - start
    assert sessions.in_session(sid) == [] and not [p for p in session.values() if _live(p)], said
    assert result.done and set(session.values()) <= set(result.ended)  # with the trap's own `sleep 1`
    assert result.killed == [f"pid {session['deaf']} (sleep)"], said  # the slow one exited by itself
    assert said == [f"stop: SIGKILL to 1 process(es) of session {sid} still running 5 s after SIGTERM: "
                    f"pid {session['deaf']} (sleep)"]
    assert 5 <= took < 5 + sessions.KILL_WAIT_S, took  # the grace, then SIGKILL: not the 5 s wait after it


def test_a_listed_pid_that_now_runs_a_later_process_is_never_signalled(session: dict[str, int],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Between listing the session and signalling it, a pid may be reused by a process started later: a signal goes
    only to a pid whose start time is still the one seen when it was listed. Here the deaf child's start time reads
    as later after its first look (as if it exited and its pid was reused): it is neither SIGTERMed nor SIGKILLed,
    and stop_session reports it as left instead of killing it."""
    deaf, real = session["deaf"], sessions.start_time
    looks = {deaf: 0}

    def start_time(pid: int) -> int | None:
        found = real(pid)
        if pid == deaf and found is not None:
            looks[deaf] += 1
            return found + (looks[deaf] > 1)
        return found

    monkeypatch.setattr(sessions, "start_time", start_time)
    monkeypatch.setattr(sessions, "KILL_WAIT_S", 0.5)
    sid = session["leader"]
    result = sessions.stop_session(sessions.Session(sid, real(sid)), grace_s=2)
    assert _live(deaf) and result.killed == [] and result.left == [f"pid {deaf} (state S)"], result
    assert not [p for r, p in session.items() if r != "deaf" and _live(p)]


# a parent outside the session that reaps its child (the session's leader) only after argv[1] seconds, as pid 1
# does on some machines for a server whose own parent is gone
SLOW_REAPER = """
import subprocess, sys, time
child = subprocess.Popen(["sleep", "600"], start_new_session=True)
print(child.pid, flush=True)
time.sleep(float(sys.argv[1]))
child.wait()
time.sleep(600)
"""


@pytest.fixture()
def slow_reaper(request: pytest.FixtureRequest) -> Iterator[int]:
    """The session leader (`sleep`) whose parent reaps it `request.param` s after it started; its pid."""
    parent = subprocess.Popen([sys.executable, "-c", SLOW_REAPER, str(request.param)], stdout=subprocess.PIPE)
    assert parent.stdout is not None
    leader = int(parent.stdout.readline())
    yield leader
    parent.kill()
    parent.wait(10)


@pytest.mark.parametrize("slow_reaper", [3], indirect=True)
def test_stop_returns_only_once_the_exited_processes_are_reaped(slow_reaper: int) -> None:
    """An exited process is still listed (`ps`: a zombie) until its parent reaps it: the issue's leftovers after
    `trtkv stop` (the restarted server's VLLM::Worker and friends, exited, their parent pid 1 not yet reaping).
    stop_session waits for the reaping too, so when it returns the pid is gone from the process table."""
    leader = slow_reaper
    said: list[str] = []
    result = sessions.stop_session(sessions.Session(leader, sessions.start_time(leader)), grace_s=5, log=said.append)
    assert sessions.stat(leader) is None, f"pid {leader} still listed: state {(sessions.stat(leader) or '?')[0]}"
    assert result.done and result.ended == [leader] and result.unreaped == [] and said == []


@pytest.mark.parametrize("slow_reaper", [600], indirect=True)
def test_an_exited_process_its_parent_never_reaps_is_named_after_the_bound(slow_reaper: int,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sessions, "REAP_WAIT_S", 1.0)
    leader = slow_reaper
    said: list[str] = []
    start = time.monotonic()
    result = sessions.stop_session(sessions.Session(leader, sessions.start_time(leader)), grace_s=5, log=said.append)
    assert time.monotonic() - start < 5
    parent = sessions.parent(leader)
    assert result.done and result.unreaped == [f"pid {leader} (sleep, exited; parent pid {parent})"], result
    assert len(said) == 1 and said[0].endswith(f"(they hold no memory, no port): pid {leader} (sleep, exited; "
                                               f"parent pid {parent})")
