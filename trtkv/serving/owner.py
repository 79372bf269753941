"""Which docker containers are this checkout's: a container trtkv starts carries the label
`trtkv.owner=<OWNER>` (the user's uid and a digest of the recipe's serve/ folder, so another
checkout's or another user's server of the same recipe has another one), and `docker run --cidfile`
records its id in serve/container.cid. trtkv stops or removes a container only when it is proven
its own: by the id recorded in its own serve/ folder, or, found by name, by that label and that
id. A same-named container that is not proven is left alone, with a StageError naming it and the
next step (docs/security.md, "Containers and cluster loads").
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trtkv.core.errors import StageError
from trtkv.serving.container import CIDFILE, read_cid, stop_container

OWNER_LABEL = "trtkv.owner"
# `docker inspect` of one container: its full id and the owner label ("<no value>" when unset)
INSPECT_FORMAT = '{{.Id}} {{index .Config.Labels "' + OWNER_LABEL + '"}}'
INSPECT_TIMEOUT_S = 30.0


def owner_id(folder: Path) -> str:
    """This checkout's owner label value for the serve/ folder `folder`: the user and the folder."""
    digest = hashlib.sha256(os.fsencode(os.path.realpath(folder))).hexdigest()[:16]
    return f"u{os.getuid()}-{digest}"


def label_args(folder: Path) -> list[str]:
    """`docker run` arguments labelling a container as this checkout's."""
    return ["--label", f"{OWNER_LABEL}={owner_id(folder)}"]


@dataclass(frozen=True)
class Found:
    """A container `docker inspect` found: its id and owner label ("" when it has none)."""

    cid: str
    owner: str


def inspect(target: str) -> Found | None:
    """The container named (or with the id) `target`; None when docker knows none. StageError when
    docker cannot answer (then nothing may be assumed about the name)."""
    docker = shutil.which("docker")
    if docker is None:
        return None
    cmd = [docker, "inspect", "--type", "container", "--format", INSPECT_FORMAT, "--", target]
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, errors="replace", timeout=INSPECT_TIMEOUT_S
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise StageError(
            f"`docker inspect {target}` could not run ({exc}), so trtkv cannot tell whose "
            f"container {target} is. Next: check docker (`docker ps`), then run the command again."
        ) from None
    text = (proc.stderr or "").strip()
    if proc.returncode != 0:
        if "No such" in text:
            return None
        raise StageError(
            f"`docker inspect {target}` exited {proc.returncode} "
            f"({text.splitlines()[-1] if text else 'no output'}), so trtkv cannot tell whose "
            f"container {target} is. Next: check docker (`docker ps`), then run the command again."
        )
    cid, _sep, owner = proc.stdout.strip().partition(" ")
    return Found(cid, "" if owner == "<no value>" else owner)


def recorded_cid(folder: Path) -> str | None:
    """The id `docker run --cidfile` recorded in `folder` (serve/), never through a symbolic
    link."""
    path = folder / CIDFILE
    return None if path.is_symlink() else read_cid(path)


def is_ours(found: Found, folder: Path) -> bool:
    """Proven this checkout's: its label is this serve/ folder's and its id the recorded one."""
    return found.owner == owner_id(folder) and found.cid == recorded_cid(folder)


def clear_leftover(name: str, folder: Path, log: Callable[[str], None] = print) -> None:
    """Before a start: a container named `name` is stopped and removed only when it is proven this
    checkout's (is_ours), a leftover of its own earlier run; any other one is refused, untouched."""
    found = inspect(name)
    if found is None:
        return
    if not is_ours(found, folder):
        raise StageError(not_ours(name, found, folder))
    done, note = stop_container(found.cid, timeout_s=10)
    log(f"serve: {note} (a leftover of this checkout's earlier `trtkv serve`)")
    if not done:
        raise StageError(f"serve: {note}")


def not_ours(name: str, found: Found, folder: Path) -> str:
    """Why trtkv leaves the container `name` alone, and what to do."""
    seen = f"{OWNER_LABEL}={found.owner}" if found.owner else f"no {OWNER_LABEL} label"
    return (
        f"a docker container named {name} (id {found.cid[:12]}) exists, with {seen}; this "
        f"checkout labels its own {OWNER_LABEL}={owner_id(folder)} and records their ids in "
        f"{folder / CIDFILE}, so it is another checkout's, another user's or not trtkv's, and "
        "trtkv leaves it alone. Next: if it is yours and no longer needed, stop it yourself "
        f"(`docker stop {name} && docker rm {name}`); else serve this recipe under another name "
        "(a copy of its recipe file under a new name gives the container another name)."
    )
