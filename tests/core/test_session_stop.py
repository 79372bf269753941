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


# a parent outside the session that starts the session's leader (`sleep`), says its pid, then never reaps it
NON_REAPER = """
import subprocess, time
child = subprocess.Popen(["sleep", "600"], start_new_session=True)
print(child.pid, flush=True)
time.sleep(600)
"""


def test_stop_returns_only_once_the_exited_processes_are_reaped() -> None:
    """An exited process is still listed (`ps`: a zombie) until its parent reaps it: the issue's leftovers after
    `trtkv stop` (the restarted vLLM server's API server and resource tracker, exited, their parent the supervisor
    gone: pid 1 reaps them, on this machine ~2 s later). stop_session waits for that too, so when it returns the pid
    is gone from the process table. Here the leader is an orphan as well (its parent `sh` exits at once)."""
    sh = subprocess.run(["sh", "-c", "setsid sleep 600 > /dev/null 2>&1 & echo $!"], capture_output=True, text=True,
                        timeout=30)
    leader = int(sh.stdout)
    deadline = time.monotonic() + 10
    while sessions.cmdline(leader) != ["sleep", "600"]:
        assert time.monotonic() < deadline, sessions.describe(leader)
        time.sleep(0.02)
    parent = int(Path(f"/proc/{leader}/stat").read_text().rsplit(")", 1)[1].split()[1])
    if parent != 1:
        os.kill(leader, signal.SIGKILL)
        pytest.skip(f"orphans go to a subreaper here (pid {parent}), not pid 1")
    said: list[str] = []
    result = sessions.stop_session(sessions.Session(leader, sessions.start_time(leader)), grace_s=5, log=said.append)
    assert sessions.stat(leader) is None, f"pid {leader} still listed: state {(sessions.stat(leader) or '?')[0]}"
    assert result.done and result.ended == [leader] and result.unreaped == [] and said == []


def test_an_exited_process_another_program_has_not_reaped_is_named_not_waited_for() -> None:
    """Its parent is a live program outside the session (a Python program that started the server and has not
    waited for it yet): it reaps it when it waits, so stop does not wait REAP_WAIT_S for that, and names it."""
    parent = subprocess.Popen([sys.executable, "-c", NON_REAPER], stdout=subprocess.PIPE)
    try:
        assert parent.stdout is not None
        leader = int(parent.stdout.readline())
        said: list[str] = []
        start = time.monotonic()
        result = sessions.stop_session(sessions.Session(leader, sessions.start_time(leader)), grace_s=5,
                                       log=said.append)
        assert time.monotonic() - start < sessions.REAP_WAIT_S / 2
        assert result.done and result.unreaped == [f"pid {leader} (sleep, exited; parent pid {parent.pid})"], result
        assert len(said) == 1 and said[0].endswith(f"not yet reaped by their parent (they hold no memory, no port): "
                                                   f"pid {leader} (sleep, exited; parent pid {parent.pid})")
    finally:
        parent.kill()
        parent.wait(10)
