"""RepoPlan: where a generated Triton repository points and what it copies (data only;
trtkv.repo.generate makes it, the README writer reads it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from trtkv.recipe import Recipe
from trtkv.recipe.layout import Artifacts


@dataclass
class RepoPlan:
    """Where the generated repository points, what it copies, and what is missing."""

    recipe: Recipe
    output: Path
    engine_dir: Path
    checkpoint_dir: Path
    tokenizer_source: Path | None  # copied into <repo>/tokenizer when set
    tokenizer_ref: str  # tokenizer_dir as written in the configs
    # where the server reads the artifacts (the paths the configs name): host, or /models/<recipe>
    at: Artifacts
    warnings: list[str] = field(default_factory=list)
