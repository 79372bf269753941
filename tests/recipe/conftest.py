"""Shared pieces of the recipe tests: a valid CPU recipe text and a helper that writes recipe files."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.recipes import GOOD

Writer = Callable[..., Path]


@pytest.fixture()
def good() -> str:
    return GOOD


@pytest.fixture()
def write(tmp_path: Path) -> Writer:
    """write(text, name="r.yaml") -> the path of a new file under tmp_path (folders made as needed)."""

    def _write(text: str | bytes, name: str = "r.yaml") -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text)
        return path

    return _write


@pytest.fixture()
def recipes_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project root (TRTKV_HOME) whose recipes/ folder the test fills; returns that recipes/ folder."""
    home = tmp_path / "home"
    (home / "recipes").mkdir(parents=True)
    monkeypatch.setenv("TRTKV_HOME", str(home))
    return home / "recipes"
