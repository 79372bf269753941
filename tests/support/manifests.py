"""Tests that make a stage folder by hand from another (a faulted checkpoint, a re-pointed engine) say so in its
manifest, as the stage would have written it: its file list, and the recipe it is now made for. Without this, build,
repo and serve rightly refuse the folder as damaged or as another recipe's (trtkv.contracts.stage.input_problem)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trtkv.contracts import contents


def relist(folder: Path, recipe: Any | None = None) -> None:
    """Rewrite `folder`'s manifest.json (replacing a link with a file) with its current files and, given one, the
    recipe it is made for."""
    path = folder / "manifest.json"
    manifest = json.loads(path.read_text())
    path.unlink()
    manifest["files"] = contents.list_files(folder)
    if recipe is not None:
        manifest["resolved_recipe"] = recipe.resolved()
    path.write_text(json.dumps(manifest, indent=2) + "\n")
