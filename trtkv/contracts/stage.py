"""The stage contract: manifest, up-to-date skip, atomic output.

Every stage writes into a temporary sibling folder and renames it into place only when it succeeded,
so an interrupted or failed stage never leaves a folder that looks complete (a folder left by a
killed run, named with a pid that is no longer alive, is removed the next time the stage runs). The
folder's `manifest.json` records the resolved recipe, its hash, the input folder's manifest hash,
tool versions and wall time; a stage whose manifest matches its inputs is skipped ("up to date")
unless forced.

Tool versions are part of the up-to-date key only where they change the output: calibrate
(ModelOpt's export, transformers' modelling, torch numerics) and build (TensorRT-LLM's engine
format) pass `versioned_tools`. The repo, serve and bench stages produce text that does not depend
on them, so a tool upgrade does not redo them.

Which output folders trtkv may replace, the leftovers of killed runs and the atomic swap are
trtkv.contracts.outputs'.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from trtkv.contracts import contents
from trtkv.contracts.outputs import MANIFEST, check_output, remove_leftovers, replace_folder
from trtkv.core import paths
from trtkv.core.errors import StageError
from trtkv.core.files import naming
from trtkv.version import __version__

if TYPE_CHECKING:
    from trtkv.contracts.artifacts import Manifest


class Recipe(Protocol):
    """What the stage contract reads of a recipe (trtkv.recipe.Recipe): its name, path and hashes,
    never its schema. A protocol, so this foundation module names no package above it."""

    @property
    def name(self) -> str: ...

    @property
    def path(self) -> Path | None: ...

    def resolved(self) -> dict[str, Any]: ...

    def section_hash(self, *sections: str) -> str: ...


TOOLS = (
    "nvidia-modelopt",
    "tensorrt_llm",
    "transformers",
    "torch",
    "tritonclient",
    "nvidia-pytriton",
)
# The tools whose versions change what calibrate and build write (their up-to-date key includes
# them).
VERSIONED_TOOLS = ("nvidia-modelopt", "transformers", "torch", "tensorrt_llm")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def tool_versions() -> dict[str, str | None]:
    return {"trtkv": __version__, **{dist: _version(dist) for dist in TOOLS}}


def manifest_hash(folder: Path) -> str | None:
    path = folder / MANIFEST
    if not path.is_file():
        return None
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_manifest(folder: Path) -> Manifest | None:
    """The folder's manifest; None when absent or not a valid manifest (the stage then counts as not
    run)."""
    from trtkv.contracts.artifacts import Manifest

    try:
        return Manifest.load(folder)
    except StageError:
        return None


@dataclass
class StageResult:
    stage: str
    output: Path
    skipped: bool
    seconds: float
    manifest: dict[str, Any]


# The fields that say which model a stage output is of, in which weight and KV formats and with
# which scales: an input whose own recipe differs here is another model's or another format's output
# (an fp8 engine under an int8 recipe), never this one's. quantization.kv_skip_layers is not one:
# the checkpoint is the same, the server applies it.
IDENTITY = ("model", "quantization.weights", "quantization.kv_cache", "quantization.kv_scales")


def _dig(data: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return data


def _changed_fields(before: Any, after: Any, where: str) -> list[str]:
    """Dotted fields whose values differ, with both values (`quantization.kv_cache: fp8 ->
    int8`)."""
    if isinstance(before, dict) and isinstance(after, dict):
        out: list[str] = []
        for key in sorted(set(before) | set(after)):
            out += _changed_fields(before.get(key), after.get(key), f"{where}.{key}")
        return out
    return [] if before == after else [f"{where}: {before!r:.40} -> {after!r:.40}"]


def input_problem(folder: Path, recipe: Recipe, needs: tuple[str, ...] = IDENTITY) -> str | None:
    """Why `folder` (a stage output) is not this recipe's input, or None when it is: no manifest,
    its files are not the ones its manifest lists, or it was made for other values of the `needs`
    fields (e.g. another KV format)."""
    manifest = read_manifest(folder)
    if manifest is None:
        return f"{folder} is missing or incomplete (no valid {MANIFEST})"
    diff = contents.differences(folder, manifest.files) if manifest.files is not None else []
    if diff:
        return f"{folder} is damaged: {contents.describe(diff)} (against its {MANIFEST})"
    made_for = manifest.resolved_recipe
    if made_for is not None:
        wanted = recipe.resolved()
        changed = [
            c
            for name in needs
            for c in _changed_fields(_dig(made_for, name), _dig(wanted, name), name)
        ]
        if changed:
            more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
            return (
                f"{folder} was made for another recipe: {'; '.join(changed[:3])}{more} (what it "
                "was made with -> this recipe)"
            )
    return None


def require_input(
    folder: Path, stage: str, produced_by: str, recipe: Recipe, needs: tuple[str, ...] = IDENTITY
) -> str:
    """The input stage's manifest hash, once `folder` is proven this recipe's input (input_problem);
    else a StageError saying what is wrong and which stage to rerun."""
    problem = input_problem(folder, recipe, needs)
    digest = manifest_hash(folder)
    if problem is not None or digest is None:
        force = " --force" if problem and "damaged" in problem else ""
        raise StageError(
            f"{stage}: {problem or folder}. Next: run `trtkv {produced_by} {recipe.name}{force}` "
            f"(or `make {produced_by} RECIPE={recipe.name}`)."
        )
    return digest


def require_made_from(
    folder: Path, source: Path, stage: str, produced_by: str, recipe: Recipe
) -> None:
    """StageError when `folder` was written from another version of `source` than the one on disk
    now (its manifest's key holds the digest of the input manifest it was made from: a rebuilt
    engine needs its repository written again)."""
    manifest = read_manifest(folder)
    made_from = manifest.key.get("input_manifest_hash") if manifest and manifest.key else None
    now = manifest_hash(source)
    if isinstance(made_from, str) and now is not None and made_from != now:
        raise StageError(
            f"{stage}: {folder} was written from another version of {source} (rebuilt since). "
            f"Next: `trtkv {produced_by} {recipe.name}`."
        )


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

    `versioned_tools`: distributions whose installed versions join the up-to-date key (an upgrade
    redoes the stage).
    """
    from trtkv.contracts.artifacts import Manifest

    output = check_output(output, stage, recipe.name, "output folder")
    remove_leftovers(output, log)
    recipe_hash = recipe.section_hash(*sections)
    if input_dir is not None and input_hash is None:
        input_hash = manifest_hash(input_dir)
    key: dict[str, Any] = {
        "stage": stage,
        "recipe_hash": recipe_hash,
        "input_manifest_hash": input_hash,
        "extra": extra_key or {},
    }
    if versioned_tools:
        versions = tool_versions()
        key["tool_versions"] = {
            name: versions.get(name, _version(name)) for name in versioned_tools
        }
    existing = read_manifest(output)
    if existing is not None and not force and existing.key == key:
        listed = existing.files
        diff = contents.differences(output, listed) if listed is not None else []
        if not diff:
            old = " (its manifest, from an older trtkv, lists no files to check)"
            note = "" if listed is not None else old
            log(f"{stage}: {output} is up to date{note} (use --force to redo)")
            return StageResult(stage, output, True, 0.0, existing.document())
        log(f"{stage}: {output} is damaged ({contents.describe(diff)}): writing it again")
    # removed again when the stage fails and leaves them empty
    created = _missing_dirs(output.parent)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = paths.temp_sibling(output, "tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    start = time.time()
    done = False
    try:
        with naming(tmp):
            extra = work(tmp) or {}
        seconds = time.time() - start
        manifest = Manifest(
            stage=stage,
            recipe=recipe.name,
            recipe_path=str(recipe.path) if recipe.path else None,
            key=key,
            recipe_hash=recipe_hash,
            input_dir=str(input_dir) if input_dir else None,
            input_manifest_hash=input_hash,
            resolved_recipe=recipe.resolved(),
            tool_versions=tool_versions(),
            wall_seconds=round(seconds, 3),
            finished_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            files=contents.list_files(tmp),
            **extra,
        )
        manifest.save(tmp)
        replace_folder(tmp, output, stage)
        done = True
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if not done:
            _remove_if_empty(created)
    log(f"{stage}: wrote {output} in {seconds:.1f} s")
    return StageResult(stage, output, False, seconds, manifest.document())


def _missing_dirs(folder: Path) -> list[Path]:
    """`folder` and those of its parents that do not exist yet, deepest first."""
    out: list[Path] = []
    while not folder.exists() and folder != folder.parent:
        out.append(folder)
        folder = folder.parent
    return out


def _remove_if_empty(folders: list[Path]) -> None:
    """Remove the folders a failed stage created (deepest first), each only while it is empty: a
    failed first `trtkv calibrate` leaves no empty engines/<recipe>/ behind that looks like a
    started build."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return
