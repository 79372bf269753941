"""What the supervisor (trtkv.serving.supervise) leaves in engines/<recipe>/serve/ and how to read
it: its record (supervisor.json: pid, start time, state), its events (events.jsonl, read from the
end), the quiet requests of benchmarks in progress (quiet/<pid>.json, a dead holder's removed), and
whether the recorded supervisor runs (alive) or is gone without cleaning up (orphaned), and ending
it (stop: its whole session, then its record; `trtkv stop` runs it before it stops the server).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trtkv.contracts.artifacts import SupervisorRecord
from trtkv.core import sessions
from trtkv.core.errors import StageError, TrtkvError
from trtkv.core.files import NotReadable, read_json, strict_json
from trtkv.core.process import is_running
from trtkv.recipe import Recipe
from trtkv.recipe.layout import serve_dir

SUPERVISOR_JSON = "supervisor.json"
EVENTS = "events.jsonl"
QUIET_DIR = "quiet"  # serve/quiet/<pid>.json: a benchmark in progress asks for no canaries


def events_path(recipe: Recipe) -> Path:
    return serve_dir(recipe) / EVENTS


def record_path(recipe: Recipe) -> Path:
    return serve_dir(recipe) / SUPERVISOR_JSON


def read_record(recipe: Recipe) -> SupervisorRecord | None:
    """The supervisor's record, or None when there is none or it cannot be read (a half-written or
    foreign file)."""
    try:
        return SupervisorRecord.load(serve_dir(recipe))
    except TrtkvError:
        return None


EVENTS_TAIL_BYTES = 256 << 10  # the end of events.jsonl that `status` reads (the file only grows)


def read_events(recipe: Recipe, last: int = 10) -> list[dict[str, Any]]:
    """The last events: JSON objects with a string `time` and `event`; any other line (damaged, not
    UTF-8, not an object) is left out, and only the file's last EVENTS_TAIL_BYTES are read."""
    try:
        with events_path(recipe).open("rb") as fh:
            fh.seek(max(0, fh.seek(0, os.SEEK_END) - EVENTS_TAIL_BYTES))
            lines = fh.read(EVENTS_TAIL_BYTES).decode("utf-8", errors="replace").splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            entry = strict_json(line)
        except ValueError:
            continue
        if (
            isinstance(entry, dict)
            and isinstance(entry.get("time"), str)
            and isinstance(entry.get("event"), str)
        ):
            out.append(entry)
    return out[-last:]


def quiet_dir(recipe: Recipe) -> Path:
    return serve_dir(recipe) / QUIET_DIR


def quiet_holders(recipe: Recipe) -> list[dict[str, Any]]:
    """The live processes that asked for quiet (a holder that died without cleaning up is removed
    here). A holder is proven by its pid AND that pid's start time (/proc/PID/stat field 22): once a
    killed bench's pid is reused by another process, its request no longer counts; a request without
    a start time (older trtkv) does not count either."""
    holders = []
    for path in sorted(quiet_dir(recipe).glob("*.json")):
        try:
            holder = read_json(path, 4096, "quiet request")
            live = _holder_runs(holder)
        except (NotReadable, ValueError, KeyError, TypeError, OverflowError, AttributeError):
            live, holder = False, {}
        if live:
            holders.append(holder)
        else:
            path.unlink(missing_ok=True)
    return holders


def _holder_runs(holder: dict[str, Any]) -> bool:
    """The quiet request's process still runs: the same pid, started at the recorded time."""
    pid, start = holder["pid"], holder.get("start_time")
    if type(pid) is not int or type(start) is not int:
        return False
    found = sessions.stat(pid)
    return (
        found is not None
        and found[0] not in ("Z", "X")
        and found[2] == start
        and is_running(pid, list(holder.get("command") or []))
    )


SUPERVISOR_MODULE = "trtkv.serving.supervise"


def _runs(record: SupervisorRecord) -> bool:
    """True while the recorded supervisor process runs, proven: the same pid and start time; in a
    record without a start time (older trtkv), the live process's whole command line is the recorded
    supervisor command."""
    found = sessions.stat(record.pid)
    if found is None or found[0] in ("Z", "X"):
        return False
    if record.start_time is not None:
        return found[2] == record.start_time
    return SUPERVISOR_MODULE in record.command and sessions.cmdline(record.pid) == record.command


def alive(recipe: Recipe) -> SupervisorRecord | None:
    """The supervisor's record when its process runs, else None."""
    record = read_record(recipe)
    if record and _runs(record):
        return record
    return None


def orphaned(recipe: Recipe) -> SupervisorRecord | None:
    """The record of a supervisor that is gone without cleaning up (killed): its server runs
    unsupervised."""
    record = read_record(recipe)
    return record if record and not _runs(record) else None


def stop(recipe: Recipe, timeout_s: float = 30.0, log: Callable[[str], None] = print) -> bool:
    """End the recipe's supervisor (its whole session); a record left by a killed one is removed and
    said so."""
    record = read_record(recipe)
    if record is None:
        return False
    pid = record.pid
    if not _runs(record):  # gone, or the pid now runs something else: nothing is signalled
        record_path(recipe).unlink(missing_ok=True)
        now = (
            ""
            if sessions.stat(pid) is None
            else f"; {sessions.describe(pid)}, not the supervisor: not signalled"
        )
        log(
            f"stop: the supervisor (pid {pid}) was already gone (killed?){now}: its server ran "
            f"unsupervised; removed {SUPERVISOR_JSON}"
        )
        return False
    start = record.start_time if record.start_time is not None else sessions.start_time(pid)
    cleanup = sessions.stop_session(sessions.Session(pid, start), grace_s=timeout_s, log=log)
    if not cleanup.done:
        raise StageError(
            f"stop {recipe.name}: the supervisor (pid {pid}) left {', '.join(cleanup.left)}; kept "
            f"{record_path(recipe)}. Next: `ps -o pid,stat,cmd -s {pid}`; end them by hand, then "
            f"`trtkv stop {recipe.name}` again."
        )
    record_path(recipe).unlink(missing_ok=True)
    log(f"stop: supervisor (pid {pid}) stopped")
    return True
