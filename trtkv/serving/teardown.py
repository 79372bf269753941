"""Ending a recorded server completely: its container (by the id `docker run --cidfile` wrote),
every process of its session (trtkv.core.sessions), and waiting until those processes hold no GPU
memory. `trtkv stop`, a failed or interrupted start and every supervisor restart go through
`end_server`.

A process is trtkv's only when the record proves it (`claim`): the recorded leader start time
matches the live pid's (a reused pid runs something started later), or, in a record without one
(older trtkv), the live leader's whole command line and its TRTKV_SERVER_SESSION marker match the
record. Without a start time, the other processes are proven only by the marker; processes of the
recorded session that nothing proves are never signalled: they are named (`doubtful`) with the
command to check them by hand. A record names files (`cidfile`, the log) that are trusted only as
direct children of the recipe's serve/ folder (no symbolic link), and a container name or id only in
docker's own syntax, so a damaged record cannot make `stop` read a FIFO, delete a file or pass
docker an option. `docker stop` returns once the container's first process is gone; the container's
other processes (listed with `docker top` before, each with its start time) are then waited for,
SIGKILLed at the bound, and named if they stay.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from trtkv.contracts.artifacts import ServerRecord
from trtkv.core import sessions
from trtkv.core.errors import StageError
from trtkv.recipe import Recipe
from trtkv.recipe.layout import serve_dir
from trtkv.serving import owner
from trtkv.serving.container import read_cid, stop_container

STOP_GRACE_S = 10.0  # a failed or interrupted start, a restart's leftovers
# docker's rule for names (ids are hex, a subset)
CONTAINER_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]{0,254}")


@dataclass
class Claim:
    """What a server record proves: the session to end (None: nothing can be proven), whether the
    recorded leader itself runs, what was seen, and live processes of the recorded session that
    cannot be proven trtkv's."""

    session: sessions.Session | None
    leader: bool
    seen: str = ""
    doubtful: list[int] = field(default_factory=list)


def claim(info: ServerRecord) -> Claim:
    """Which of the processes a record names are proven the server trtkv started (the module
    docstring's rules)."""
    sid = info.session_id if info.session_id is not None else info.pid
    marker = info.session_marker
    if info.session_start is not None:
        session = sessions.Session(sid, info.session_start, marker)
        alive = sessions.leader_alive(session)
        seen = (
            ""
            if alive or sessions.stat(sid) is None
            else f"{sessions.describe(sid)}: not the recorded server (started at tick "
            f"{info.session_start})"
        )
        return Claim(session, alive, seen)
    found = sessions.stat(sid)
    live = found is not None and found[0] not in ("Z", "X")
    if (
        live
        and found
        and marker
        and sessions.cmdline(sid) == info.command
        and sessions.marker_of(sid) == marker
    ):
        return Claim(sessions.Session(sid, found[2], marker), True)
    why = (
        "its command line or session marker differ from the record's"
        if marker
        else "the record has neither the leader's start time nor a session marker to prove it"
    )
    seen = sessions.describe(sid) + (f": not proven the recorded server ({why})" if live else "")
    # only the processes carrying the marker
    by_marker = sessions.Session(-1, None, marker) if marker else None
    proven = set(sessions.members(by_marker)) if by_marker else set()
    return Claim(by_marker, False, seen, [p for p in sessions.in_session(sid) if p not in proven])


def running(info: ServerRecord) -> bool:
    """True while the recorded server's leader runs: the same process, proven as `claim` says."""
    return claim(info).leader


@dataclass
class Stopped:
    """What stopping a recorded server did: was its leader running, the session's processes ended,
    what was left, and what could not be proven or stopped (the record is then kept)."""

    was_running: bool = False
    cleanup: sessions.Cleanup = field(default_factory=sessions.Cleanup)
    container_done: bool = False
    container_failed: str = ""  # docker's answer when the container could not be stopped
    gpu_note: str = ""
    seen: str = ""
    doubtful: list[int] = field(default_factory=list)

    @property
    def stopped_something(self) -> bool:
        return self.was_running or self.container_done or bool(self.cleanup.ended)

    @property
    def done(self) -> bool:
        """Nothing of the server is left that trtkv could end, and nothing it was not sure of."""
        return self.cleanup.done and not self.container_failed and not self.doubtful


def session_of(info: ServerRecord) -> sessions.Session:
    """The session a record proves (Session(-1): none)."""
    return claim(info).session or sessions.Session(-1)


def own_file(name: str | None, folder: Path) -> Path | None:
    """`name` when it is a direct child of `folder` (not a symbolic link), else None: the only files
    a record may make trtkv read or delete."""
    if not name:
        return None
    path = Path(name)
    try:
        inside = path.is_absolute() and path.parent.resolve(strict=True) == folder.resolve(
            strict=True
        )
    except (OSError, RuntimeError):
        return None
    return path if inside and not path.is_symlink() else None


def end_server(
    info: ServerRecord, timeout_s: float, log: Callable[[str], None], folder: Path
) -> Stopped:
    """Stop the container (by its recorded id; by its name only when trtkv.serving.owner proves it
    this checkout's), end every proven process of the session (SIGTERM, grace, SIGKILL; until none
    remains), then wait (bounded) until those processes hold no GPU memory. `folder`: the recipe's
    serve/ folder, where the record's files must be."""
    found = claim(info)
    result = Stopped(was_running=found.leader, seen=found.seen, doubtful=found.doubtful)
    # host pid -> start time of the container's processes (`docker top`)
    in_container: dict[int, int] = {}
    if info.container:
        cid = read_cid(own_file(info.cidfile, folder))
        target = cid or info.container
        if not cid and CONTAINER_NAME.fullmatch(target):
            # no id recorded: a container of that name is another's unless proven this checkout's
            target, why, unknown = _by_name(target, folder)
            if why:
                log(f"stop: {why}")
            result.container_failed = why if unknown else ""
        if target and CONTAINER_NAME.fullmatch(target):
            in_container = {
                p: t for p in container_pids(target) if (t := sessions.start_time(p)) is not None
            }
            result.container_done, note = stop_container(target, timeout_s)
            result.container_failed = "" if result.container_done else note
            log(f"stop: {note}")
        elif target:
            result.container_failed = (
                f"the record's container {target[:80]!r} is not a docker name or id"
            )
    if found.session is not None:
        result.cleanup = sessions.stop_session(found.session, grace_s=timeout_s, log=log)
    # `docker stop` returns when its first process is gone, the others
    if in_container and result.container_done:
        # may still be exiting (a GPU process releasing its memory): wait for them, then SIGKILL,
        # bounded
        inside = sessions.end_listed(in_container, grace_s=timeout_s, log=log)
        result.cleanup.ended += inside.ended
        result.cleanup.left += inside.left
        result.cleanup.killed += inside.killed
    released, result.gpu_note = sessions.wait_gpu_released(
        result.cleanup.ended + list(in_container)
    )
    if not released:
        log(f"stop: {result.gpu_note}")
    return result


def _by_name(name: str, folder: Path) -> tuple[str, str, bool]:
    """(the id of the container `name` when it is proven this checkout's, else ""; why not; whether
    docker could not answer, so the record must stay)."""
    try:
        found = owner.inspect(name)
    except StageError as exc:
        return "", str(exc), True
    if found is None:
        return "", "", False
    if not owner.is_ours(found, folder):
        return "", owner.not_ours(name, found, folder), False
    return found.cid, "", False


def refusal(info: ServerRecord, result: Stopped, record: Path) -> str:
    """Why the record is kept and what to do by hand: survivors, unproven processes, a container
    docker kept."""
    sid = info.session_id if info.session_id is not None else info.pid
    said = []
    if result.cleanup.left:
        said.append(
            f"could not end {', '.join(result.cleanup.left)} (state D waits on the kernel: a "
            "device or a mount; EPERM: another user's)"
        )
    if result.doubtful:
        said.append(
            f"{result.seen}; not signalled: "
            + "; ".join(sessions.describe(p) for p in result.doubtful[:5])
        )
    if result.container_failed:
        said.append(result.container_failed)
    return (
        f"{' '.join(said)}. Kept {record} so `trtkv stop` can try again. Next: check them (`ps -o "
        f"pid,lstart,cmd -s {sid}`), end what is the server's by hand (`kill PID`; `docker stop "
        f"{info.container or 'NAME'}`), then `trtkv stop` again, or remove {record} once nothing "
        "of the server is left."
    )


def stop_server(
    recipe: Recipe, *, timeout_s: float = 30.0, log: Callable[[str], None] = print
) -> Stopped | None:
    """End the recipe's recorded server and its whole session; None when none is recorded.
    server.json stays when something could not be ended or proven (D state, EPERM, a container
    docker kept, processes the record cannot prove), so the next stop finds them; `refusal` says
    what to do by hand."""
    folder = serve_dir(recipe)
    info = ServerRecord.load(folder)
    if info is None:
        return None
    result = end_server(info, timeout_s, log, folder)
    ended = len(result.cleanup.ended)
    if result.done:
        ServerRecord.path(serve_dir(recipe)).unlink(missing_ok=True)
        cidfile = own_file(info.cidfile, folder)
        if cidfile is not None:
            cidfile.unlink(missing_ok=True)
    if result.container_done:
        log(
            f"stop: {recipe.name} server (container {info.container}, docker run pid {info.pid}) "
            "stopped"
        )
    elif result.was_running:
        log(
            f"stop: {recipe.name} server (pid {info.pid}) stopped; cleaned: {ended} processes of "
            f"its session in {result.cleanup.seconds:g} s"
        )
    elif ended:
        log(
            f"stop: the server for {recipe.name} (pid {info.pid}) had exited, leaving {ended} "
            f"process(es) of its session; cleaned: {ended} processes"
        )
    elif result.done:
        seen = f" ({result.seen})" if result.seen else ""
        log(
            f"stop: the server for {recipe.name} (pid {info.pid}) had already exited{seen}, "
            f"nothing of its session left; removed {ServerRecord.FILE}"
        )
    if not result.done:
        log(f"stop: {refusal(info, result, ServerRecord.path(serve_dir(recipe)))}")
    return result


def stop(recipe: Recipe, *, timeout_s: float = 30.0, log: Callable[[str], None] = print) -> bool:
    """End the recipe's recorded server and every process of its session; False when nothing was
    running. StageError when something of it is left (it names the survivors and what to do by
    hand)."""
    result = stop_server(recipe, timeout_s=timeout_s, log=log)
    if result is None:
        log(
            f"stop: no server recorded for {recipe.name} ({ServerRecord.path(serve_dir(recipe))} "
            "does not exist)"
        )
        return False
    if not result.done:
        info = ServerRecord.load(serve_dir(recipe))
        raise StageError(
            f"stop {recipe.name}: "
            + (
                refusal(info, result, ServerRecord.path(serve_dir(recipe)))
                if info
                else "some of the server is left"
            )
        )
    return result.stopped_something


def container_pids(target: str) -> list[int]:
    """The host pids of a running container's processes (`docker top`), whose GPU memory is waited
    on too."""
    docker = shutil.which("docker")
    if docker is None:
        return []
    try:
        proc = subprocess.run(
            [docker, "top", target, "-eo", "pid"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return []
    return (
        [int(line) for line in proc.stdout.split()[1:] if line.isdigit()]
        if proc.returncode == 0
        else []
    )
