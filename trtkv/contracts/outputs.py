"""A stage's output folder: trtkv replaces only what it wrote (absent, empty, or holding a
manifest.json or owner file of the same stage and recipe), strictly inside its parent; the leftovers
of killed runs (`.<name>.tmp-<pid>`, `.<name>.old-<pid>` of a pid no longer alive) are removed; a
new folder is swapped into place atomically, keeping the old one's mode.
trtkv.contracts.stage.run_stage writes through these; the stages that write in place claim
theirs."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

from trtkv.core import paths
from trtkv.core.errors import StageError
from trtkv.core.process import pid_alive

MANIFEST = "manifest.json"
# trtkv.core.paths.temp_sibling's names
LEFTOVER = re.compile(r"^\.(?P<name>.+)\.(?:tmp|old)-(?P<pid>\d+)$")


def remove_leftovers(output: Path, log: Callable[[str], None] = print) -> list[Path]:
    """Remove `.<name>.tmp-<pid>` / `.<name>.old-<pid>` siblings of `output` whose pid is not
    alive."""
    removed: list[Path] = []
    if not output.parent.is_dir():
        return removed
    for sibling in output.parent.iterdir():
        match = LEFTOVER.match(sibling.name)
        if not match or sibling.is_symlink() or not sibling.is_dir():
            continue
        pid = int(match.group("pid"))
        size = len(sibling.name.encode("utf-8", "surrogateescape")) - len(
            match.group("name").encode("utf-8", "surrogateescape")
        )
        # the bytes temp_sibling left for the name beside this pid's suffix
        room = paths.NAME_MAX - size
        if match.group("name") != paths.sibling_stem(output.name, room):
            continue
        if pid == os.getpid() or pid_alive(pid):
            continue
        shutil.rmtree(sibling, ignore_errors=True)
        removed.append(sibling)
        log(f"removed {sibling} (left by an interrupted run, pid {pid} is gone)")
    return removed


# {"stage", "recipe"} in folders that have no manifest.json of a stage (deploy, probe, compare)
OWNER = ".trtkv-owner"


def _owner(folder: Path) -> tuple[str | None, str | None, str | None] | None:
    """(stage, recipe, target) that trtkv recorded in `folder` (manifest.json or the owner file; the
    target: deploy's k8s/slurm/dynamo); None when it holds neither."""
    for name in (MANIFEST, OWNER):
        path = folder / name
        if not path.is_file() or path.is_symlink():
            continue
        try:
            with path.open("rb") as fh:
                data = json.loads(fh.read(1 << 20) or b"null")
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("stage"), str):
            recipe, target = data.get("recipe"), data.get("target")
            return (
                data["stage"],
                recipe if isinstance(recipe, str) else None,
                target if isinstance(target, str) else None,
            )
    return None


def check_inside(output: Path, stage: str) -> Path:
    """`output` made absolute; refuses a folder that is not strictly inside its parent (`.`, `..`,
    `/`, a symlink)."""
    absolute = Path(os.path.abspath(output))
    if (
        output.name in ("", ".", "..")
        or absolute == absolute.parent
        or absolute.is_symlink()
        or absolute.resolve().parent != absolute.parent.resolve()
    ):
        raise StageError(
            f"{stage}: refusing to replace {output}: a stage output must be a folder strictly "
            "inside its parent (not `.`, `..`, `/` or a symbolic link). Nothing was changed. "
            f"Next: name a new folder, e.g. {absolute.parent / (stage + '-out')}."
        )
    return absolute


def check_output(
    output: Path, stage: str, recipe: str, option: str = "--output", target: str | None = None
) -> Path:
    """Refuse an output folder trtkv would replace but did not write: it must be absent, empty, or
    hold a manifest (or owner file) of the same stage and recipe (and, given one, target: a deploy
    never replaces another target's folder). Returns the absolute path."""
    absolute = check_inside(output, stage)
    if not absolute.exists():
        return absolute
    if not absolute.is_dir():
        raise StageError(
            f"{stage}: {option} {output} is a file, not a folder. Nothing was changed. "
            f"Next: name a new or empty folder."
        )
    if not any(absolute.iterdir()):
        return absolute
    owner = _owner(absolute)
    if (
        owner is not None
        and owner[:2] == (stage, recipe)
        and (target is None or owner[2] in (None, target))
    ):
        return absolute
    seen = (
        f"it holds trtkv's `{owner[0]}` output of recipe {owner[1]!r}"
        + (f" for target {owner[2]}" if owner[2] else "")
        if owner
        else "it holds files trtkv did not write (no manifest.json)"
    )
    mine = f"`{stage}` output of recipe {recipe!r}" + (f" for target {target}" if target else "")
    raise StageError(
        f"{stage}: {option} {output}: {seen}, so trtkv will not replace it (it replaces only its "
        f"own {mine}). Nothing was changed. Next: name a new or empty folder, or move that one "
        "aside yourself."
    )


def claim_output(output: Path, stage: str, recipe: str, option: str = "--output") -> Path:
    """check_output, then create the folder and record trtkv as its owner (for stages that write in
    place)."""
    absolute = check_output(output, stage, recipe, option)
    absolute.mkdir(parents=True, exist_ok=True)
    if _owner(absolute) is None:
        (absolute / OWNER).write_text(json.dumps({"stage": stage, "recipe": recipe}) + "\n")
    return absolute


def in_place_output(given: Path | None, default: Path, stage: str, recipe: str) -> Path:
    """The folder of a stage that writes in place (probe, compare): a user's --output goes through
    claim_output; trtkv's own default folder (under engines/) is created as it is."""
    if given is not None:
        return claim_output(given, stage, recipe)
    default.mkdir(parents=True, exist_ok=True)
    return default


def _umask() -> int:
    """The process umask, read without changing it (os.umask sets it, a race with other threads)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def replace_folder(tmp: Path, output: Path, stage: str) -> None:
    """Swap `tmp` into `output` (strictly inside its parent): the old folder is moved aside first
    and removed after; the new folder keeps the old one's mode (a new one gets the umask's)."""
    output = check_inside(output, stage)
    old = paths.temp_sibling(output, "old")
    mode = (output.stat().st_mode & 0o7777) if output.is_dir() else (0o777 & ~_umask())
    os.chmod(tmp, mode)
    if output.exists():
        output.rename(old)
    try:
        tmp.rename(output)
    except OSError:
        if old.exists() and not output.exists():
            old.rename(output)
        raise
    shutil.rmtree(old, ignore_errors=True)
