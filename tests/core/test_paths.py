"""Where trtkv looks for recipes and writes outputs: a checkout, TRTKV_HOME, or (installed as a wheel) the current
directory; never the site-packages folder above the package."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtkv.core import paths
from trtkv.core.errors import RecipeError


def test_a_checkout_finds_its_own_recipes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRTKV_HOME", raising=False)
    assert paths.project_root() == paths.PACKAGE_DIR.parent and (paths.recipes_dir() / "smollm2_fp8kv.yaml").is_file()


def test_an_installed_package_uses_the_current_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A wheel's package sits in site-packages, with no recipes/ beside it: trtkv works on the user's folder."""
    from trtkv.recipe import load_recipe

    site = tmp_path / "site-packages"
    (site / "trtkv").mkdir(parents=True)
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.delenv("TRTKV_HOME", raising=False)
    monkeypatch.setattr(paths, "PACKAGE_DIR", site / "trtkv")
    monkeypatch.chdir(project)
    assert paths.project_root() == project and paths.engines_dir() == project / "engines"
    with pytest.raises(RecipeError, match=r"no recipes folder at .*project/recipes.*TRTKV_HOME.*trtkv init"):
        load_recipe("smollm2_fp8kv")
    assert paths.recipes_dir() == project / "recipes"


def test_trtkv_home_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRTKV_HOME", str(tmp_path))
    assert paths.project_root() == tmp_path.resolve() and paths.recipes_dir() == tmp_path.resolve() / "recipes"
