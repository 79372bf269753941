"""The serving side of the Triton TensorRT-LLM container (its command lines are
trtkv.backends.container): the container id `docker run --cidfile` leaves in
engines/<recipe>/serve/, and stopping the container."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from trtkv.core.files import NotReadable, read_capped
from trtkv.core.tools import quote

DOCKER_STOP_TIMEOUT_S = 30


# engines/<recipe>/serve/container.cid: `docker run --cidfile`, the container's id
CIDFILE = "container.cid"


def with_cidfile(cmd: list[str], cidfile: Path) -> list[str]:
    """`docker run ...` with `--cidfile <cidfile>` (docker writes the container id there), so `stop`
    ends that very container, not only the `docker run` client; other commands unchanged."""
    if cmd[:2] != ["docker", "run"] or "--cidfile" in cmd:
        return cmd
    return [*cmd[:2], "--cidfile", str(cidfile), *cmd[2:]]


def read_cid(cidfile: str | Path | None) -> str | None:
    """The container id `docker run --cidfile` wrote (None: no file yet, or not an id)."""
    if not cidfile:
        return None
    try:
        cid = read_capped(Path(cidfile), 256, "container id file").decode("ascii").strip()
    except (NotReadable, UnicodeDecodeError):
        return None
    return cid if cid and all(c in "0123456789abcdef" for c in cid) else None


def stop_container(name: str, timeout_s: float = DOCKER_STOP_TIMEOUT_S) -> tuple[bool, str]:
    """`docker stop -t N <name>` then `docker rm -f <name>` (`name`: a container name or id; `docker
    stop` SIGKILLs after N s): (done, what happened); docker missing: (False, why)."""
    docker = shutil.which("docker")
    if docker is None:
        return False, (
            f"docker is not on PATH here, so container {name} was not stopped. Next: on the docker "
            f"host run `docker stop {name} && docker rm -f {name}`."
        )
    said = []
    for cmd, wait_s in (
        ([docker, "stop", "-t", str(int(timeout_s)), name], timeout_s + 30),
        ([docker, "rm", "-f", name], 60.0),
    ):
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, errors="replace", timeout=wait_s
            )
        except subprocess.TimeoutExpired:
            said.append(f"`{quote(cmd)}` did not finish in {wait_s:.0f} s")
            continue
        except OSError as exc:
            said.append(f"`{quote(cmd)}` could not run ({exc.strerror or exc})")
            continue
        text = (proc.stderr or proc.stdout).strip()
        if proc.returncode != 0 and "No such container" not in text:
            said.append(
                f"`{quote(cmd)}` exited {proc.returncode}: "
                f"{text.splitlines()[-1] if text else 'no output'}"
            )
    if said:
        return False, f"container {name}: " + "; ".join(
            said
        ) + f". Next: check `docker ps -a --filter name={name}`."
    return True, f"container {name} stopped and removed"
