"""Shared test fixtures. Stage outputs go to a temporary engines/ folder, never the checkout's."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture()
def engines_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point TRTKV_ENGINES and TRTKV_TRITON_REPO at a temp folder for one test."""
    engines = tmp_path / "engines"
    monkeypatch.setenv("TRTKV_ENGINES", str(engines))
    monkeypatch.setenv("TRTKV_TRITON_REPO", str(tmp_path / "triton_repo"))
    return engines


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The real SmolLM2-135M-Instruct as an HF folder (converted once from the packaged GGUF, then cached)."""
    from trtkv.model import resolve_model_dir
    from trtkv.recipe import load_recipe

    return resolve_model_dir(load_recipe("smollm2_fp8kv"))
