"""Where `trtkv plan --estimate` finds aiconfigurator from any working folder (#54 item 5): beside the installed trtkv
as well as under $TRTKV_HOME, or the python $TRTKV_AICONFIGURATOR names; the message names the paths and the command."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from trtkv.core import paths
from trtkv.plan import aic, aic_where


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """trtkv as a wheel would lay it out (site-packages/trtkv, no recipes/ above it), run from a project folder of the
    user's own with TRTKV_HOME unset."""
    site, project = tmp_path / "site", tmp_path / "project"
    (site / "trtkv").mkdir(parents=True)
    project.mkdir()
    monkeypatch.setattr(paths, "PACKAGE_DIR", site / "trtkv")
    monkeypatch.delenv("TRTKV_HOME", raising=False)
    monkeypatch.delenv(aic_where.AIC_ENV, raising=False)
    monkeypatch.chdir(project)
    return project


def test_looks_beside_the_installed_trtkv(installed: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    monkeypatch.setattr(aic_where, "installed_from", lambda: checkout)
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "elsewhere" / ".venv"))
    looked = aic_where.pythons()
    assert looked == [installed / ".venv-aic/bin/python", tmp_path / "site/.venv-aic/bin/python",
                      checkout / ".venv-aic/bin/python", tmp_path / "elsewhere/.venv-aic/bin/python"]
    assert aic.python_path() == looked[0]  # none there: the first place looked
    (checkout / ".venv-aic/bin").mkdir(parents=True)
    (checkout / ".venv-aic/bin/python").write_text("")
    (checkout / "tools").mkdir()
    (checkout / "tools/aic_estimate.py").write_text("")
    assert aic.python_path() == checkout / ".venv-aic/bin/python"
    assert aic_where.tool_path() == checkout / "tools/aic_estimate.py"


def test_the_venv_beside_the_checkout_venv(installed: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(aic_where, "installed_from", lambda: None)
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "trtkv-checkout" / ".venv"))
    assert aic_where.pythons()[-1] == tmp_path / "trtkv-checkout/.venv-aic/bin/python"


def test_explicit_python_is_the_only_place(installed: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(aic_where.AIC_ENV, str(tmp_path / "py"))
    assert aic_where.pythons() == [tmp_path / "py"]
    assert aic.python_path() == tmp_path / "py"
    assert f"{aic_where.AIC_ENV}={tmp_path / 'py'}" in aic_where.install_hint("0.12.0")


def test_message_names_the_paths_and_the_command(installed: Path, monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / "Makefile").write_text("")
    monkeypatch.setattr(aic_where, "installed_from", lambda: checkout)
    hint = aic_where.install_hint("0.12.0")
    assert str(installed / ".venv-aic/bin/python") in hint and str(checkout / ".venv-aic/bin/python") in hint
    assert f"`make install-aiconfigurator` in {checkout}" in hint and aic_where.AIC_ENV in hint
