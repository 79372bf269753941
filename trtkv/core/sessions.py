"""A server's whole process session, found in /proc: its members, ending them all, and the GPU
memory they held.

Linux has no kill-a-session call. trtkv starts every server as a session leader
(`start_new_session`) with a marker in its environment (TRTKV_SERVER_SESSION=<uuid>) and records the
session id with the leader's start time (/proc/PID/stat fields 6 and 22). The members are the
processes of that session id (while the leader is the one recorded, or gone: Linux never reuses a
pid that is still some process's session id) plus every process carrying the marker, for children
that call setsid (Ray, some vLLM workers). Nothing is found by name.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

MARKER_ENV = "TRTKV_SERVER_SESSION"
PROC = Path("/proc")
# after SIGKILL: a process that still exists then is stuck (D state) or not ours (EPERM)
KILL_WAIT_S = 5.0
# an exited process stays in the process table (a zombie, listed by `ps`) until its parent reaps
# it: a server's processes whose parent is gone are reaped by pid 1, on some machines seconds later
REAP_WAIT_S = 15.0
GPU_WAIT_S = 60.0
NVIDIA_SMI_QUERY = ["--query-compute-apps=pid,used_memory", "--format=csv,noheader"]
KILL: Callable[[int, int], None] = os.kill  # how a signal is sent (a test makes it answer EPERM)


@dataclass(frozen=True)
class Session:
    """What identifies a server's processes: session id (= the leader's pid), its start time, the
    env marker."""

    sid: int
    leader_start: int | None = None  # /proc/PID/stat field 22 (clock ticks since boot)
    marker: str | None = None


@dataclass
class Cleanup:
    """How ending a session went: the pids found and ended, and what was left when it gave up."""

    ended: list[int] = field(default_factory=list)
    left: list[str] = field(default_factory=list)  # "pid 123 (state D)" / "pid 456 (EPERM)"
    seconds: float = 0.0
    # what SIGTERM and the grace did not end, SIGKILLed: "pid 123 (VLLM::EngineCor)"
    killed: list[str] = field(default_factory=list)
    # exited, but still not reaped by their parent after REAP_WAIT_S (they hold no memory, no port)
    unreaped: list[str] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return not self.left


def new_marker() -> str:
    return uuid.uuid4().hex


def _read_stat(pid: int) -> tuple[str, list[str]] | None:
    """The command name (field 2) and the fields after it from /proc/PID/stat; None when it is
    gone."""
    try:
        # many times per second while a session ends: keep it cheap
        with open(f"{PROC}/{pid}/stat", "rb") as fh:
            text = fh.read().decode(errors="replace")
    except OSError:
        return None
    # the command name may hold spaces and parentheses
    head, _, rest = text.rpartition(")")
    return head[head.find("(") + 1 :], rest.split()


def stat(pid: int) -> tuple[str, int, int] | None:
    """(state, session id, start time) of a pid from /proc/PID/stat (fields 3, 6, 22); None when it
    is gone."""
    read = _read_stat(pid)
    try:
        return (read[1][0], int(read[1][3]), int(read[1][19])) if read else None
    except (IndexError, ValueError):
        return None


def name(pid: int) -> str:
    """The process's command name (/proc/PID/stat field 2, what `ps -o comm` shows; a title set with
    setproctitle, e.g. `VLLM::EngineCor`), "?" when it is gone."""
    read = _read_stat(pid)
    return (read[0] if read else "") or "?"


def parent(pid: int) -> int | None:
    """The parent pid (/proc/PID/stat field 4); None when the process is gone."""
    read = _read_stat(pid)
    try:
        return int(read[1][1]) if read else None
    except (IndexError, ValueError):
        return None


def start_time(pid: int) -> int | None:
    found = stat(pid)
    return found[2] if found else None


def marker_of(pid: int) -> str | None:
    """The TRTKV_SERVER_SESSION value in a process's environment (None: absent, or not readable: not
    ours)."""
    try:
        data = (PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return None
    key = f"{MARKER_ENV}=".encode()
    for item in data.split(b"\0"):
        if item.startswith(key):
            return item[len(key) :].decode(errors="replace")
    return None


def cmdline(pid: int) -> list[str] | None:
    """The process's argument list from /proc/PID/cmdline (None: gone or not readable); bounded at 1
    MiB."""
    try:
        with open(f"{PROC}/{pid}/cmdline", "rb") as fh:
            data = fh.read(1 << 20)
    except OSError:
        return None
    return [part.decode(errors="replace") for part in data.split(b"\0")[:-1]] if data else []


def describe(pid: int) -> str:
    """What a pid is now, for messages: "pid 12 is gone" or "pid 12 runs `sleep 600` (state S,
    session 12)"."""
    found = stat(pid)
    if found is None:
        return f"pid {pid} is gone"
    argv = cmdline(pid)
    shown = " ".join(argv)[:120] if argv else "?"
    return (
        f"pid {pid} runs `{shown}` (state {found[0]}, session {found[1]}, started at tick "
        f"{found[2]})"
    )


def in_session(sid: int) -> list[int]:
    """The live processes whose session id is `sid` (found in /proc; never this process)."""
    out = []
    for pid in _pids():
        found = stat(pid)
        if (
            pid != os.getpid()
            and found is not None
            and found[0] not in ("Z", "X")
            and found[1] == sid
        ):
            out.append(pid)
    return sorted(out)


def _pids() -> list[int]:
    return [int(name) for name in os.listdir(PROC) if name.isdigit()]


def leader_alive(session: Session) -> bool:
    """True while the recorded leader runs (same pid, same start time, not a zombie)."""
    found = stat(session.sid)
    return (
        found is not None
        and found[0] not in ("Z", "X")
        and (session.leader_start is None or found[2] == session.leader_start)
    )


def members(session: Session, exited: bool = False) -> list[int]:
    """The live (not zombie) processes of the session, leader included; never this process.
    `exited`: with those that have exited but are not yet reaped by their parent (zombies: found by
    session id only, their environment is gone)."""
    leader = stat(session.sid)
    # a leader pid now running something started later: the recorded session emptied before the pid
    # was reused
    reused = (
        leader is not None
        and session.leader_start is not None
        and leader[2] != session.leader_start
    )
    me = os.getpid()
    out = []
    for pid in _pids():
        if pid == me:
            continue
        found = stat(pid)
        if found is None or found[0] == "X" or (found[0] == "Z" and not exited):
            continue
        if session.leader_start is not None and found[2] < session.leader_start:
            continue  # older than the leader: not one of its descendants
        if (found[1] == session.sid and not reused) or (
            session.marker and marker_of(pid) == session.marker
        ):
            out.append(pid)
    return sorted(out)


def _reap(pids: list[int]) -> None:
    """Collect those that are this process's own children (else they stay zombies until we exit)."""
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass


def _signal(pids: list[int], sig: int, denied: set[int]) -> None:
    for pid in pids:
        try:
            KILL(pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError:
            denied.add(pid)


@dataclass
class _Ending:
    """One stop_session's bookkeeping: every member seen, with the start time it had then (a signal
    goes only to a pid that still has it: never to a later process that reused the pid), the pids
    that answered EPERM, and what had to be SIGKILLed ("pid 123 (VLLM::EngineCor)")."""

    seen: dict[int, int] = field(default_factory=dict)
    denied: set[int] = field(default_factory=set)
    killed: list[str] = field(default_factory=list)

    def note(self, pids: list[int]) -> list[int]:
        """Remember the pids not seen before, with their start times; returns those."""
        fresh = []
        for pid in pids:
            if pid not in self.seen and (started := start_time(pid)) is not None:
                self.seen[pid] = started
                fresh.append(pid)
        return fresh

    def send(self, pids: list[int], sig: int) -> None:
        same = [p for p in pids if p in self.seen and start_time(p) == self.seen[p]]
        if sig == signal.SIGKILL:
            self.killed += [f"pid {p} ({name(p)})" for p in same if p not in self.denied]
        _signal(same, sig, self.denied)


def _zombies(session: Session, ending: _Ending) -> list[int]:
    """The session's processes (or those seen as its members) that exited and are not yet reaped."""
    out = {p for p in members(session, exited=True) if (stat(p) or ("",))[0] == "Z"}
    for pid, started in ending.seen.items():
        found = stat(pid)
        if found is not None and found[0] == "Z" and found[2] == started:
            out.add(pid)
    return sorted(out)


def _wait_reaped(session: Session, ending: _Ending, seconds: float) -> list[int]:
    """Reap this process's own children, and wait (at most `seconds`) until pid 1 (the parent of a
    server whose own parent is gone) has reaped the rest (`ps` lists them till then). One whose
    parent is another live program is not waited for: that program reaps it when it waits."""
    deadline = time.monotonic() + seconds
    while True:
        _reap(sorted(ending.seen))
        left = _zombies(session, ending)
        soon = [p for p in left if parent(p) in (None, 1, os.getpid(), *ending.seen)]
        if not soon or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)


def _wait_empty(session: Session, seconds: float, sig: int | None, ending: _Ending) -> list[int]:
    """Poll until no member of the session is left or `seconds` pass, sending `sig` to members that
    appear meanwhile."""
    deadline = time.monotonic() + seconds
    while True:
        _reap(sorted(ending.seen))
        left = members(session)
        fresh = ending.note(left)
        if sig is not None and fresh:
            ending.send(fresh, sig)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)


def stop_session(
    session: Session, grace_s: float = 10.0, log: Callable[[str], None] | None = None
) -> Cleanup:
    """End every member: SIGTERM the leader (it stops its children in order), then SIGTERM all that
    remain, up to `grace_s` in all, then SIGKILL (each named in `killed` and the log); wait until
    none remains. Processes still there after SIGKILL (D state, EPERM) are reported in `left`, not
    waited on forever. Then, since an exited process stays listed until its parent reaps it, waits
    (at most REAP_WAIT_S) for that too; those still unreaped are named in `unreaped`."""
    start = time.monotonic()
    ending = _Ending()
    found = members(session)
    ending.note(found)
    if found:
        if leader_alive(session):
            ending.send([session.sid], signal.SIGTERM)
            deadline = start + grace_s * 0.8
            while leader_alive(session) and time.monotonic() < deadline:
                _reap([session.sid])
                time.sleep(0.05)
            found = _wait_empty(session, 0.5, None, ending)  # its children follow it out
        if found:
            ending.send(found, signal.SIGTERM)
            remaining = max(0.5, grace_s - (time.monotonic() - start))
            found = _wait_empty(session, remaining, signal.SIGTERM, ending)
        if found:
            ending.send(found, signal.SIGKILL)
            found = _wait_empty(session, KILL_WAIT_S, signal.SIGKILL, ending)
    unreaped = _wait_reaped(session, ending, REAP_WAIT_S)
    result = Cleanup(
        ended=sorted(set(ending.seen) - set(found)),
        seconds=round(time.monotonic() - start, 2),
        killed=ending.killed,
        unreaped=[f"pid {p} ({name(p)}, exited; parent pid {parent(p)})" for p in unreaped],
    )
    if log and result.killed:
        log(
            f"stop: SIGKILL to {len(result.killed)} process(es) of session {session.sid} still "
            f"running {grace_s:g} s after SIGTERM: {', '.join(result.killed)}"
        )
    if log and result.unreaped:
        log(
            f"stop: {len(result.unreaped)} process(es) of session {session.sid} exited, not yet "
            "reaped by their parent (they hold no memory, no port): " + ", ".join(result.unreaped)
        )
    for pid in found:
        state = (stat(pid) or ("gone",))[0]
        result.left.append(f"pid {pid} ({'EPERM' if pid in ending.denied else 'state ' + state})")
    if log and result.left:
        log(
            f"stop: could not end {len(result.left)} process(es) of session {session.sid}: "
            f"{', '.join(result.left)}"
        )
    return result


def end_listed(
    started: dict[int, int], grace_s: float, log: Callable[[str], None] | None = None
) -> Cleanup:
    """Wait (at most `grace_s`) until each listed process (pid -> its start time, proving it is the
    one listed) has exited, SIGKILL those still there, and wait for them (KILL_WAIT_S): a
    container's processes after `docker stop`, which returns once the container's first process is
    gone while the others may still be exiting."""
    start = time.monotonic()

    def live() -> list[int]:
        return [
            p
            for p, t in started.items()
            if (found := stat(p)) is not None and found[2] == t and found[0] not in ("Z", "X")
        ]

    denied: set[int] = set()
    killed: list[str] = []
    left = live()
    for sig, wait_s in ((None, grace_s), (signal.SIGKILL, KILL_WAIT_S)):
        if sig is not None and left:
            killed = [f"pid {p} ({name(p)})" for p in left]
            _signal(left, sig, denied)
        deadline = time.monotonic() + wait_s
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = live()
    result = Cleanup(
        ended=sorted(set(started) - set(left)),
        seconds=round(time.monotonic() - start, 2),
        killed=killed,
    )
    if log and killed:
        log(
            f"stop: SIGKILL to the container's processes left after {grace_s:g} s: "
            + ", ".join(killed)
        )
    result.left = [
        f"pid {p} ({'EPERM' if p in denied else 'state ' + (stat(p) or ('gone',))[0]})"
        for p in left
    ]
    if log and result.left:
        log(
            f"stop: could not end {len(result.left)} process(es) of the container: "
            f"{', '.join(result.left)}"
        )
    return result


def gpu_pids(run: Callable[[list[str]], str] | None = None) -> dict[int, int] | None:
    """pid -> MiB of GPU memory from nvidia-smi; None where nvidia-smi is absent or fails."""
    if run is None:
        smi = shutil.which("nvidia-smi")
        if smi is None:
            return None

        def run(args: list[str]) -> str:
            return subprocess.run(
                [smi, *args], capture_output=True, text=True, timeout=30, check=True
            ).stdout

    try:
        text = run(NVIDIA_SMI_QUERY)
    except (OSError, subprocess.SubprocessError):
        return None
    out = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2 and parts[0].isdigit():
            digits = "".join(ch for ch in parts[1] if ch.isdigit())
            out[int(parts[0])] = int(digits or 0)
    return out


def wait_gpu_released(
    pids: list[int],
    timeout_s: float = GPU_WAIT_S,
    poll_s: float = 1.0,
    run: Callable[[list[str]], str] | None = None,
) -> tuple[bool, str]:
    """Wait (at most `timeout_s`) until none of `pids` holds GPU memory: (released, what was
    seen)."""
    if not pids:
        return True, "no processes"
    deadline = time.monotonic() + timeout_s
    start = time.monotonic()
    while True:
        held = gpu_pids(run)
        if held is None:
            return True, "no nvidia-smi here"
        mine = {p: mib for p, mib in held.items() if p in set(pids)}
        if not mine:
            return True, f"GPU memory free after {time.monotonic() - start:.1f} s"
        if time.monotonic() >= deadline:
            return False, (
                f"after {timeout_s:.0f} s, GPU memory is still held by "
                + ", ".join(f"pid {p} ({mib} MiB)" for p, mib in sorted(mine.items()))
            )
        time.sleep(poll_s)
