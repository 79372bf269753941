"""The stage contract: manifest, up-to-date skip, atomic output.

Every stage writes into a temporary sibling folder and renames it into place only when it succeeded, so an
interrupted or failed stage never leaves a folder that looks complete (a folder left by a killed run, named with a
pid that is no longer alive, is removed the next time the stage runs). The folder's `manifest.json` records the
resolved recipe, its hash, the input folder's manifest hash, tool versions and wall time; a stage whose manifest
matches its inputs is skipped ("up to date") unless forced.

Tool versions are part of the up-to-date key only where they change the output: calibrate (ModelOpt's export,
transformers' modelling, torch numerics) and build (TensorRT-LLM's engine format) pass `versioned_tools`. The
repo, serve and bench stages produce text that does not depend on them, so a tool upgrade does not redo them.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtkv.errors import StageError
from trtkv.process import pid_alive
from trtkv.recipe import Recipe
from trtkv.version import __version__

MANIFEST = "manifest.json"
TOOLS = ("nvidia-modelopt", "tensorrt_llm", "transformers", "torch", "tritonclient", "nvidia-pytriton")
# The tools whose versions change what calibrate and build write (their up-to-date key includes them).
VERSIONED_TOOLS = ("nvidia-modelopt", "transformers", "torch", "tensorrt_llm")
LEFTOVER = re.compile(r"^\.(?P<name>.+)\.(?:tmp|old)-(?P<pid>\d+)$")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def tool_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"trtkv": __version__}
    for dist in TOOLS:
        out[dist] = _version(dist)
    return out


def remove_leftovers(output: Path, log: Callable[[str], None] = print) -> list[Path]:
    """Remove `.<name>.tmp-<pid>` / `.<name>.old-<pid>` siblings of `output` whose pid is not alive."""
    removed: list[Path] = []
    if not output.parent.is_dir():
        return removed
    for sibling in output.parent.iterdir():
        match = LEFTOVER.match(sibling.name)
        if not match or match.group("name") != output.name or not sibling.is_dir():
            continue
        pid = int(match.group("pid"))
        if pid == os.getpid() or pid_alive(pid):
            continue
        shutil.rmtree(sibling, ignore_errors=True)
        removed.append(sibling)
        log(f"removed {sibling} (left by an interrupted run, pid {pid} is gone)")
    return removed


def manifest_hash(folder: Path) -> str | None:
    path = folder / MANIFEST
    if not path.is_file():
        return None
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The folder's manifest (trtkv.artifacts.Manifest) as written; None when absent or not a valid manifest (the
    stage then counts as not run)."""
    from trtkv.artifacts import Manifest

    try:
        manifest = Manifest.load(folder)
    except StageError:
        return None
    return manifest.model_dump() if manifest is not None else None


@dataclass
class StageResult:
    stage: str
    output: Path
    skipped: bool
    seconds: float
    manifest: dict[str, Any]


def require_input(folder: Path, stage: str, produced_by: str, recipe: Recipe) -> str:
    """The input stage's manifest hash; a clear error when that stage has not run."""
    digest = manifest_hash(folder)
    if digest is None:
        raise StageError(f"{stage}: {folder} is missing or incomplete (no {MANIFEST}). "
                         f"Next: run `trtkv {produced_by} {recipe.name}` (or `make {produced_by} RECIPE={recipe.name}`).")
    return digest


def run_stage(
    stage: str,
    recipe: Recipe,
    output: Path,
    work: Callable[[Path], dict[str, Any] | None],
    *,
    sections: tuple[str, ...] = (),
    input_dir: Path | None = None,
    input_hash: str | None = None,
    force: bool = False,
    extra_key: dict[str, Any] | None = None,
    versioned_tools: tuple[str, ...] = (),
    log: Callable[[str], None] = print,
) -> StageResult:
    """Run `work(tmp_dir)` unless `output` is up to date; `work` returns extra manifest fields.

    `versioned_tools`: distributions whose installed versions join the up-to-date key (an upgrade redoes the stage).
    """
    remove_leftovers(output, log)
    recipe_hash = recipe.section_hash(*sections)
    if input_dir is not None and input_hash is None:
        input_hash = manifest_hash(input_dir)
    key: dict[str, Any] = {"stage": stage, "recipe_hash": recipe_hash, "input_manifest_hash": input_hash,
                           "extra": extra_key or {}}
    if versioned_tools:
        versions = tool_versions()
        key["tool_versions"] = {name: versions.get(name, _version(name)) for name in versioned_tools}
    existing = read_manifest(output)
    if existing and not force and existing.get("key") == key:
        log(f"{stage}: {output} is up to date (use --force to redo)")
        return StageResult(stage, output, True, 0.0, existing)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.parent / f".{output.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    start = time.time()
    try:
        extra = work(tmp) or {}
        seconds = time.time() - start
        manifest = {
            "stage": stage,
            "recipe": recipe.name,
            "recipe_path": str(recipe.path) if recipe.path else None,
            "key": key,
            "recipe_hash": recipe_hash,
            "input_dir": str(input_dir) if input_dir else None,
            "input_manifest_hash": input_hash,
            "resolved_recipe": recipe.resolved(),
            "tool_versions": tool_versions(),
            "wall_seconds": round(seconds, 3),
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            **extra,
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=False, default=str) + "\n")
        _replace(tmp, output)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"{stage}: wrote {output} in {seconds:.1f} s")
    return StageResult(stage, output, False, seconds, manifest)


def _replace(tmp: Path, output: Path) -> None:
    """Swap `tmp` into `output`: the old folder is moved aside first and removed after."""
    old = output.parent / f".{output.name}.old-{os.getpid()}"
    if output.exists():
        output.rename(old)
    try:
        tmp.rename(output)
    except OSError:
        if old.exists() and not output.exists():
            old.rename(output)
        raise
    shutil.rmtree(old, ignore_errors=True)
