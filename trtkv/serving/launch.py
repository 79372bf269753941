"""Running the chosen server command as the recipe's server (trtkv.serving.serve picks the command):
in its own session with a new environment marker (trtkv.core.sessions), its log under
engines/<recipe>/serve/, a docker container's id in a cidfile, the record (server.json) written at
once, then the wait for readiness (trtkv.serving.readiness) and serve/manifest.json. A start that
fails, times out or is interrupted ends everything it started (trtkv.serving.teardown) and removes
the record, or keeps it when something could not be ended.
"""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from trtkv.contracts.artifacts import Manifest, ServerRecord
from trtkv.contracts.stage import tool_versions
from trtkv.core import sessions
from trtkv.core.errors import StageError
from trtkv.core.tools import quote
from trtkv.recipe import Recipe
from trtkv.recipe.layout import serve_dir
from trtkv.serving.container import CIDFILE, with_cidfile
from trtkv.serving.owner import label_args
from trtkv.serving.readiness import ready_path, wait_ready
from trtkv.serving.teardown import STOP_GRACE_S, end_server, refusal

SERVER_JSON = "server.json"


def server_json(recipe: Recipe) -> Path:
    return serve_dir(recipe) / SERVER_JSON


def write_server(recipe: Recipe, info: ServerRecord) -> Path:
    return info.save(serve_dir(recipe))


def write_serve_manifest(recipe: Recipe, info: ServerRecord) -> Path:
    """serve/manifest.json (every stage folder has one): the server started, how and how fast it
    became ready."""
    return Manifest(
        stage="serve",
        recipe=recipe.name,
        key=None,
        wall_seconds=info.ready_seconds,
        backend=info.backend,
        command=info.command,
        model_repository=info.model_repository,
        started_at=info.started_at,
        container=info.container,
        tool_versions=tool_versions(),
    ).save(serve_dir(recipe))


def serve_folder(recipe: Recipe) -> Path:
    """engines/<recipe>/serve, created; StageError when it is a symbolic link (the log, the record
    and the container id would then be written wherever it points)."""
    out = serve_dir(recipe)
    if out.is_symlink():
        raise StageError(
            f"serve {recipe.name}: {out} is a symbolic link (to {os.readlink(out)}); trtkv writes "
            "the server's log, record and container id only into a real serve/ folder of the "
            f"recipe's. Nothing was started. Next: remove the link (`rm {out}`), then serve again."
        )
    out.mkdir(parents=True, exist_ok=True)
    return out


def open_log(path: Path, append: bool = False) -> BinaryIO:
    """A log of serve/ (the server's, truncated; the supervisor's, appended), opened without
    following a symbolic link (O_NOFOLLOW): a link planted at its name is refused, never written
    through."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY
    flags |= os.O_APPEND if append else os.O_TRUNC
    try:
        fd = os.open(path, flags | os.O_NONBLOCK, 0o644)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a FIFO nobody reads
            raise StageError(
                f"{path} is a FIFO; trtkv writes its logs only as files of its own. Nothing was "
                f"started. Next: remove it (`rm {path}`), then serve again."
            ) from None
        if exc.errno != errno.ELOOP:
            raise
        raise StageError(
            f"{path} is a symbolic link; trtkv writes its logs only as files of its own in "
            "serve/, never through a link (it would overwrite the file the link names). Nothing "
            f"was started. Next: remove the link (`rm {path}`), then serve again."
        ) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise StageError(
            f"{path} is not a regular file (a device?); trtkv writes its logs only as files of "
            f"its own. Nothing was started. Next: remove it (`rm {path}`), then serve "
            "again."
        )
    os.set_blocking(fd, True)
    return os.fdopen(fd, "ab" if append else "wb")


def start_server(
    recipe: Recipe,
    cmd: list[str],
    repo: Path,
    env: dict[str, str],
    timeout_s: float | None,
    log: Callable[[str], None],
    container: str | None = None,
    name: str = "tritonserver",
    served_model: str | None = None,
) -> ServerRecord:
    out = serve_folder(recipe)
    log_path = out / f"{name}.log"
    t = recipe.triton
    # every process of this server carries it, also one that calls setsid
    marker = sessions.new_marker()
    env = {**env, sessions.MARKER_ENV: marker}
    cidfile = None
    if container and cmd[:2] == ["docker", "run"]:
        cidfile = str(out / CIDFILE)
        Path(cidfile).unlink(missing_ok=True)  # docker run refuses to overwrite it
        cmd = with_cidfile(cmd, Path(cidfile))
        cmd = [*cmd[:2], *label_args(out), *cmd[2:]]  # this checkout's (trtkv.serving.owner)
    with open_log(log_path) as log_file:
        log_file.write(f"$ {quote(cmd)}\n".encode())
        log_file.flush()
        proc = subprocess.Popen(
            cmd,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=out,
            start_new_session=True,
        )
    info = ServerRecord(
        pid=proc.pid,
        host=t.host,
        http_port=t.http_port,
        grpc_port=t.grpc_port,
        metrics_port=t.metrics_port,
        command=cmd,
        log=str(log_path),
        model_repository=str(repo),
        started_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        recipe=recipe.name,
        backend=recipe.build.backend.value,
        container=container,
        cidfile=cidfile,
        session_id=proc.pid,
        session_start=sessions.start_time(proc.pid),
        session_marker=marker,
        frontend=name,
        served_model_name=served_model if name != "tritonserver" else None,
    )
    write_server(recipe, info)
    log(
        f"serve: started {name} (pid {proc.pid}), waiting up to "
        f"{timeout_s or t.startup_timeout_s:.0f} s for {info.http_url}{ready_path(name)}; log "
        f"{log_path}"
    )
    try:
        info.ready_seconds = round(wait_ready(info, proc, timeout_s or t.startup_timeout_s), 2)
    # failed, timed out or interrupted half-way: nothing of this start stays behind
    except BaseException:
        ended = end_server(info, STOP_GRACE_S, lambda m: log(m.replace("stop:", "serve:", 1)), out)
        proc.poll()
        if ended.done:  # else the record stays, so `trtkv stop` finds what is left
            server_json(recipe).unlink(missing_ok=True)
        else:
            log(f"serve: {refusal(info, ended, server_json(recipe))}")
        raise
    write_server(recipe, info)
    write_serve_manifest(recipe, info)
    ports = (
        f"HTTP {info.http_url}, gRPC {t.host}:{t.grpc_port}, metrics http://{t.host}:{t.metrics_port}/metrics"
        if name == "tritonserver"
        else f"OpenAI API {info.http_url}/v1 (model {served_model}), metrics "
        f"{info.http_url}/metrics"
    )
    log(
        f"serve: {recipe.name} ready in {info.ready_seconds:.1f} s: {ports} (stop: trtkv stop "
        f"{recipe.name})"
    )
    return info
