"""The stage contract (trtkv.contracts.stage): atomic output, up-to-date key, leftovers of killed runs, tool versions."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from trtkv.contracts import stage
from trtkv.recipe import load_recipe


def _work(tmp: Path) -> dict[str, Any]:
    (tmp / "out.txt").write_text("done\n")
    return {"wrote": "out.txt"}


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_leftovers_of_dead_runs_are_removed_live_ones_kept(tmp_path: Path) -> None:
    output = tmp_path / "engine"
    dead, alive = _dead_pid(), os.getppid()
    leftovers = [tmp_path / f".engine.tmp-{dead}", tmp_path / f".engine.old-{dead}"]
    kept = [tmp_path / f".engine.tmp-{alive}", tmp_path / f".checkpoint.tmp-{dead}", tmp_path / "engine.tmp-1"]
    for folder in leftovers + kept:
        folder.mkdir()
        (folder / "half.bin").write_bytes(b"x")
    said: list[str] = []
    result = stage.run_stage("build", load_recipe("smollm2_fp8kv"), output, _work, log=said.append)
    assert not result.skipped and (output / "out.txt").is_file()
    assert not any(p.exists() for p in leftovers)
    assert all(p.exists() for p in kept), "a live run's folder and other stages' folders stay"
    assert any(f"pid {dead} is gone" in line for line in said)


def test_tool_versions_join_the_key_only_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    recipe = load_recipe("smollm2_fp8kv")
    quiet: list[str] = []
    versioned = tmp_path / "checkpoint"
    plain = tmp_path / "repo"
    stage.run_stage("calibrate", recipe, versioned, _work, versioned_tools=stage.VERSIONED_TOOLS, log=quiet.append)
    stage.run_stage("repo", recipe, plain, _work, log=quiet.append)
    key = json.loads((versioned / stage.MANIFEST).read_text())["key"]
    assert set(key["tool_versions"]) == {"nvidia-modelopt", "transformers", "torch", "tensorrt_llm"}
    assert "tool_versions" not in json.loads((plain / stage.MANIFEST).read_text())["key"]
    assert stage.run_stage("calibrate", recipe, versioned, _work, versioned_tools=stage.VERSIONED_TOOLS,
                           log=quiet.append).skipped
    real = stage.tool_versions()
    monkeypatch.setattr(stage, "tool_versions", lambda: {**real, "transformers": "99.0"})  # an upgrade
    assert not stage.run_stage("calibrate", recipe, versioned, _work, versioned_tools=stage.VERSIONED_TOOLS,
                               log=quiet.append).skipped
    assert stage.run_stage("repo", recipe, plain, _work, log=quiet.append).skipped  # text stages are not redone


def test_failed_work_keeps_the_previous_output(tmp_path: Path) -> None:
    recipe = load_recipe("smollm2_fp8kv")
    output = tmp_path / "engine"
    stage.run_stage("build", recipe, output, _work, log=lambda _m: None)
    before = (output / stage.MANIFEST).read_bytes()

    def failing(tmp: Path) -> dict[str, Any]:
        (tmp / "partial").write_text("x")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        stage.run_stage("build", recipe, output, failing, force=True, log=lambda _m: None)
    assert (output / stage.MANIFEST).read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["engine"]


def test_a_failed_first_run_leaves_no_empty_recipe_folder(tmp_path: Path) -> None:
    """A first `trtkv calibrate` that fails removes the engines/<recipe>/ it created (only while empty)."""
    recipe = load_recipe("smollm2_fp8kv")

    def failing(tmp: Path) -> dict[str, Any]:
        (tmp / "partial").write_text("x")
        raise RuntimeError("boom")

    output = tmp_path / "engines" / "r" / "checkpoint"
    with pytest.raises(RuntimeError, match="boom"):
        stage.run_stage("calibrate", recipe, output, failing, log=lambda _m: None)
    assert list(tmp_path.iterdir()) == []  # engines/ and engines/r/ were made by this run: both gone
    (tmp_path / "engines" / "r" / "serve").mkdir(parents=True)  # something else lives there: kept
    with pytest.raises(RuntimeError, match="boom"):
        stage.run_stage("calibrate", recipe, output, failing, log=lambda _m: None)
    assert sorted(p.name for p in (tmp_path / "engines" / "r").iterdir()) == ["serve"]
