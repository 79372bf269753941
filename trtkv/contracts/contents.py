"""What a stage folder holds, as its manifest lists it: every file's relative name, size and sha256
(a symbolic link: its target). "Up to date" and "a complete input" both mean the folder's files are
exactly the listed ones, so a folder with a deleted model or an overwritten config.pbtxt is rebuilt
or refused, never reused. A listed file may be reached through a symbolic link (a copy of a folder
made of links): what counts is its bytes.

Hashing every byte of a 100 GB engine on each check would cost minutes, so a large file (over
FULL_HASH_BYTES) is re-read only when its size or modification time (ns) differ from the listed
ones, as git's index does; smaller files (configs, pbtxt, scripts, JSON) are hashed every time.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trtkv.contracts.artifacts import ListedFile

FULL_HASH_BYTES = 64 << 20
# the manifest lists the others; the owner file is rewritten in place
SKIP = ("manifest.json", ".trtkv-owner")
SHOWN = 5  # differences named in a message
# written by Python when the server runs a repository's model.py: not the stage's output
CACHES = ("__pycache__",)


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _walk(folder: Path) -> dict[str, Path]:
    """relative name -> path of every file and symbolic link under `folder` (links are not
    followed)."""
    out: dict[str, Path] = {}
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if d not in CACHES]
        base = Path(root)
        for name in files + [d for d in dirs if (base / d).is_symlink()]:
            path = base / name
            rel = path.relative_to(folder).as_posix()
            if rel not in SKIP:
                out[rel] = path
    return out


def list_files(folder: Path) -> dict[str, dict[str, Any]]:
    """The listing a manifest stores: relative name -> {"bytes", "sha256", "mtime_ns"} or {"link":
    target}."""
    out: dict[str, dict[str, Any]] = {}
    for rel, path in sorted(_walk(folder).items()):
        if path.is_symlink():
            out[rel] = {"link": os.readlink(path)}
            continue
        info = path.stat()
        out[rel] = {"bytes": info.st_size, "sha256": _digest(path), "mtime_ns": info.st_mtime_ns}
    return out


def _same(path: Path, listed: ListedFile) -> bool:
    if listed.link is not None:
        return path.is_symlink() and os.readlink(path) == listed.link
    # a listed file may be reached through a link (a copy made of links): its bytes count
    if not path.is_file():
        return False
    info = path.stat()
    if info.st_size != listed.bytes:
        return False
    if info.st_size > FULL_HASH_BYTES and info.st_mtime_ns == listed.mtime_ns:
        return True
    return _digest(path) == listed.sha256


def differences(folder: Path, listed: dict[str, ListedFile]) -> list[str]:
    """What differs between `folder` and its listing ("missing a/b", "changed c", "not listed d");
    empty: the same."""
    found = _walk(folder)
    out = [f"missing {rel}" for rel in listed if rel not in found]
    changed = [rel for rel, got in listed.items() if rel in found and not _same(found[rel], got)]
    out += [f"changed {rel}" for rel in changed]
    out += [f"not listed {rel}" for rel in found if rel not in listed]
    return out


def describe(diff: list[str]) -> str:
    """The first few differences, and how many more."""
    more = f" and {len(diff) - SHOWN} more" if len(diff) > SHOWN else ""
    return ", ".join(diff[:SHOWN]) + more
