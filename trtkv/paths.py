"""Where trtkv finds recipes and writes outputs (all relative to the project root)."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def project_root() -> Path:
    """The checkout root (TRTKV_HOME overrides, e.g. for an installed package)."""
    env = os.environ.get("TRTKV_HOME")
    if env:
        return Path(env).resolve()
    return PACKAGE_DIR.parent


def recipes_dir() -> Path:
    return project_root() / "recipes"


def calibration_data_dir() -> Path:
    return project_root() / "calibration_data"


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


def recipe_output_dir(recipe_name: str) -> Path:
    return engines_dir() / recipe_name
