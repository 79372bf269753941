"""Where trtkv finds recipes and writes outputs (all relative to the project root)."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # trtkv/


# Each top-level folder trtkv writes, and what moves it (help text and docs/where-it-runs.md read
# this)
FOLDERS: dict[str, str] = {
    "recipes/": "$TRTKV_HOME/recipes",
    "engines/": "$TRTKV_ENGINES, else $TRTKV_HOME/engines",
    "triton_repo/": "$TRTKV_TRITON_REPO, else $TRTKV_HOME/triton_repo",
    "deploy/": "$TRTKV_HOME/deploy",
    "the cache": "$TRTKV_CACHE, else $XDG_CACHE_HOME/trtkv (~/.cache/trtkv): packaged models "
    "converted once",
}
HOME = (
    "$TRTKV_HOME: the checkout trtkv runs from when it holds recipes/ (the folder above the "
    "package), else the current folder"
)


def project_root() -> Path:
    """Where recipes/, calibration_data/ and the stage outputs live: TRTKV_HOME; else the checkout
    trtkv runs from (the folder above the package, when it holds recipes/); else, for an installed
    wheel (site-packages has no recipes/), the current directory: a user's own project folder."""
    env = os.environ.get("TRTKV_HOME")
    if env:
        return Path(env).resolve()
    if (PACKAGE_DIR.parent / "recipes").is_dir():
        return PACKAGE_DIR.parent
    return Path.cwd().resolve()


def recipes_dir() -> Path:
    return project_root() / "recipes"


def engines_dir() -> Path:
    env = os.environ.get("TRTKV_ENGINES")
    return Path(env).resolve() if env else project_root() / "engines"


def triton_repo_dir() -> Path:
    env = os.environ.get("TRTKV_TRITON_REPO")
    return Path(env).resolve() if env else project_root() / "triton_repo"


def cache_dir() -> Path:
    """Converted models and other reusable artefacts (TRTKV_CACHE overrides)."""
    env = os.environ.get("TRTKV_CACHE")
    if env:
        return Path(env).resolve()
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "trtkv"


def recipe_folder(root: Path, recipe_name: str) -> Path:
    """`root/<recipe_name>`, refusing a name that is not one plain folder name (`.`, `..`, a `/`, a
    leading dot): defence in depth behind the recipe-name rule, so no stage ever writes to `root`
    itself or outside it."""
    if (
        not recipe_name
        or recipe_name in (".", "..")
        or recipe_name.startswith(".")
        or any(c in recipe_name for c in "/\\\0")
        or not recipe_name.isprintable()
    ):
        from trtkv.core.errors import StageError

        raise StageError(
            f"recipe name {recipe_name!r} is not a plain folder name, so trtkv will not write "
            f"{root}/<name>. Next: rename the recipe file (lower-case letters, digits, `_` and "
            "`-`)."
        )
    return root / recipe_name


def recipe_output_dir(recipe_name: str) -> Path:
    """engines/<recipe>: every stage folder of one recipe."""
    return recipe_folder(engines_dir(), recipe_name)


NAME_MAX = 255  # bytes in one file name on Linux file systems (ext4, xfs, btrfs, overlayfs)


def sibling_stem(name: str, room: int) -> str:
    """`name` itself when `room` bytes hold it, else a prefix of it and `~` and 8 hex digits of its
    sha256, within `room` bytes (the same for the same name, so the next run finds its
    leftovers)."""
    data = name.encode("utf-8", "surrogateescape")
    if len(data) <= room:
        return name
    import hashlib

    digest = hashlib.sha256(data).hexdigest()[:8]
    head = data[: max(0, room - 9)].decode("utf-8", "ignore")  # never half a character
    return f"{head}~{digest}"


def temp_sibling(path: Path, tag: str, pid: int | None = None) -> Path:
    """`.<name>.<tag>-<pid>` beside `path`: the temporary or old copy a stage writes before the
    rename. Its name always fits in NAME_MAX bytes, also for a legal 250-byte `path` name (the name
    is shortened with its digest); trtkv.contracts.outputs.remove_leftovers recognises both
    forms."""
    suffix = f".{tag}-{os.getpid() if pid is None else pid}"
    return path.parent / f".{sibling_stem(path.name, NAME_MAX - 1 - len(suffix))}{suffix}"
