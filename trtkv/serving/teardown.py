"""Ending a recorded server completely: its container (by the id `docker run --cidfile` wrote), every process of its
session (trtkv.core.sessions), and waiting until those processes hold no GPU memory. `trtkv stop`, a failed or interrupted
start and every supervisor restart go through `end_server`.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field

from trtkv.contracts.artifacts import ServerRecord
from trtkv.core import sessions
from trtkv.core.process import is_running
from trtkv.serving.container import read_cid, stop_container


def running(info: ServerRecord) -> bool:
    """True while the recorded server's leader runs (the same process: pid, start time and program)."""
    if info.session_start is not None and not sessions.leader_alive(session_of(info)):
        return False
    return is_running(info.pid, info.command)


@dataclass
class Stopped:
    """What stopping a recorded server did: was its leader running, the session's processes ended, what was left."""

    was_running: bool = False
    cleanup: sessions.Cleanup = field(default_factory=sessions.Cleanup)
    container_done: bool = False
    gpu_note: str = ""

    @property
    def stopped_something(self) -> bool:
        return self.was_running or self.container_done or bool(self.cleanup.ended)


def session_of(info: ServerRecord) -> sessions.Session:
    """The recorded session (a record from before sessions were recorded: the pid, while it runs the command)."""
    if info.session_id is not None:
        return sessions.Session(info.session_id, info.session_start, info.session_marker)
    return sessions.Session(info.pid if is_running(info.pid, info.command) else -1)


def end_server(info: ServerRecord, timeout_s: float, log: Callable[[str], None]) -> Stopped:
    """Stop the container (by its recorded id, else its name), end every process of the session (SIGTERM, grace,
    SIGKILL; until none remains), then wait (bounded) until those processes hold no GPU memory."""
    result = Stopped(was_running=running(info))
    in_container: list[int] = []
    if info.container:
        target = read_cid(info.cidfile) or info.container
        in_container = container_pids(target)
        result.container_done, note = stop_container(target, timeout_s)
        log(f"stop: {note}")
    session = session_of(info)
    if session.sid > 0:
        result.cleanup = sessions.stop_session(session, grace_s=timeout_s, log=log)
    released, result.gpu_note = sessions.wait_gpu_released(result.cleanup.ended + in_container)
    if not released:
        log(f"stop: {result.gpu_note}")
    return result


def container_pids(target: str) -> list[int]:
    """The host pids of a running container's processes (`docker top`), whose GPU memory is waited on too."""
    docker = shutil.which("docker")
    if docker is None:
        return []
    try:
        proc = subprocess.run([docker, "top", target, "-eo", "pid"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return []
    return [int(line) for line in proc.stdout.split()[1:] if line.isdigit()] if proc.returncode == 0 else []
