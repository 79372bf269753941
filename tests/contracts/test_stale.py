"""Stale and damaged stage folders are never reused (issue 42, item 5): an input is this recipe's only when its
manifest was made for the same model, weights and KV format and its files are the ones the manifest lists; "up to
date" means the same, so a repository with a deleted model folder or an overwritten config.pbtxt is written again."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from trtkv.contracts import stage
from trtkv.core.errors import StageError
from trtkv.recipe import load_recipe
from trtkv.recipe.layout import engine_dir
from trtkv.repo import generate_repo


def _engine(tmp: Path) -> dict[str, Any]:
    (tmp / "runtime.json").write_text('{"kv": "whatever the build wrote"}\n')
    (tmp / "weights").mkdir()
    (tmp / "weights" / "rank0.bin").write_bytes(os.urandom(64))
    return {}


def test_an_engine_built_for_another_kv_format_is_refused_by_repo_and_serve(engines_tmp: Path) -> None:
    """quantization.kv_cache=int8 without a rebuild: the fp8-built engine is not this recipe's input (before: repo
    wrote an int8 repository over it and serve's check, "manifest.json exists", passed)."""
    fp8 = load_recipe("smollm2_fp8kv")
    stage.run_stage("build", fp8, engine_dir(fp8), _engine, sections=("model", "quantization", "build"),
                    log=lambda _m: None)
    assert stage.require_input(engine_dir(fp8), "serve", "build", fp8)  # its own recipe: accepted
    int8 = load_recipe("smollm2_fp8kv", ["quantization.kv_cache=int8"])
    with pytest.raises(StageError, match=r"made for another recipe: quantization\.kv_cache: 'fp8' -> 'int8'.*"
                                         r"trtkv build smollm2_fp8kv"):
        stage.require_input(engine_dir(int8), "serve", "build", int8)
    with pytest.raises(StageError, match=r"repo: .*quantization\.kv_cache: 'fp8' -> 'int8'"):
        generate_repo(int8, log=lambda _m: None)
    # a change the engine does not depend on (the port it is served on) is not a different engine
    assert stage.require_input(engine_dir(fp8), "serve", "build", load_recipe("smollm2_fp8kv", ["triton.http_port=9"]))


def test_a_damaged_input_is_refused(engines_tmp: Path) -> None:
    recipe = load_recipe("smollm2_fp8kv")
    out = engine_dir(recipe)
    stage.run_stage("build", recipe, out, _engine, log=lambda _m: None)
    (out / "weights" / "rank0.bin").write_bytes(os.urandom(64))  # same size, other bytes
    with pytest.raises(StageError, match=r"damaged: changed weights/rank0\.bin.*--force"):
        stage.require_input(out, "serve", "build", recipe)
    (out / "weights" / "rank0.bin").unlink()
    (out / "extra.txt").write_text("x")
    with pytest.raises(StageError, match=r"missing weights/rank0\.bin, not listed extra\.txt"):
        stage.require_input(out, "serve", "build", recipe)


def test_up_to_date_means_the_listed_files(tmp_path: Path) -> None:
    """Deleting a model folder or overwriting a config.pbtxt makes the stage write the folder again (before: "up to
    date"); the manifest lists every file with its digest."""
    recipe = load_recipe("smollm2_fp8kv")
    out = tmp_path / "repo"

    def repo(tmp: Path) -> dict[str, Any]:
        for model in ("ensemble", "preprocessing"):
            (tmp / model / "1").mkdir(parents=True)
            (tmp / model / "config.pbtxt").write_text(f'name: "{model}"\n')
        return {}

    said: list[str] = []
    stage.run_stage("repo", recipe, out, repo, log=said.append)
    listed = json.loads((out / stage.MANIFEST).read_text())["files"]
    assert set(listed) == {"ensemble/config.pbtxt", "preprocessing/config.pbtxt"}
    assert all(len(entry["sha256"]) == 64 for entry in listed.values())
    assert stage.run_stage("repo", recipe, out, repo, log=said.append).skipped
    (out / "preprocessing" / "config.pbtxt").write_text('name: "changed"\n')
    assert not stage.run_stage("repo", recipe, out, repo, log=said.append).skipped
    assert any("damaged (changed preprocessing/config.pbtxt)" in line for line in said)
    assert (out / "preprocessing" / "config.pbtxt").read_text() == 'name: "preprocessing"\n'
    for path in (out / "ensemble").rglob("*"):
        if path.is_file():
            path.unlink()
    assert not stage.run_stage("repo", recipe, out, repo, log=said.append).skipped
    assert (out / "ensemble" / "config.pbtxt").is_file()
    assert stage.run_stage("repo", recipe, out, repo, log=said.append).skipped


def test_a_repository_of_a_rebuilt_engine_and_a_checkpoint_of_another_format_are_refused(engines_tmp: Path) -> None:
    """serve: the repository must be the one written from the engine on disk (its key holds the engine manifest's
    digest); build: the checkpoint must be this recipe's (model, weights, KV format)."""
    from trtkv.build.stage import build
    from trtkv.recipe.layout import checkpoint_dir, repo_dir

    recipe = load_recipe("smollm2_fp8kv")
    engine = engine_dir(recipe)
    stage.run_stage("build", recipe, engine, _engine, log=lambda _m: None)
    stage.run_stage("repo", recipe, repo_dir(recipe), _engine, input_dir=engine, log=lambda _m: None)
    stage.require_made_from(repo_dir(recipe), engine, "serve", "repo", recipe)  # made from this engine: fine
    stage.run_stage("build", recipe, engine, _engine, force=True, log=lambda _m: None)  # rebuilt
    with pytest.raises(StageError, match=r"written from another version of .*engine.*trtkv repo smollm2_fp8kv"):
        stage.require_made_from(repo_dir(recipe), engine, "serve", "repo", recipe)
    stage.run_stage("calibrate", recipe, checkpoint_dir(recipe), _engine, log=lambda _m: None)
    int8 = load_recipe("smollm2_fp8kv", ["quantization.kv_cache=int8"])
    with pytest.raises(StageError, match=r"build smollm2_fp8kv: .*'fp8' -> 'int8'.*trtkv calibrate smollm2_fp8kv"):
        build(int8, log=lambda _m: None)


def test_python_bytecode_a_server_writes_is_not_damage(tmp_path: Path) -> None:
    """tritonserver's Python backend writes model/1/__pycache__/ into the repository it serves: still up to date."""
    recipe = load_recipe("smollm2_fp8kv")
    out = tmp_path / "repo"

    def repo(tmp: Path) -> dict[str, Any]:
        (tmp / "m" / "1").mkdir(parents=True)
        (tmp / "m" / "1" / "model.py").write_text("x = 1\n")
        return {}

    stage.run_stage("repo", recipe, out, repo, log=lambda _m: None)
    (out / "m" / "1" / "__pycache__").mkdir()
    (out / "m" / "1" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\0")
    assert stage.run_stage("repo", recipe, out, repo, log=lambda _m: None).skipped


def test_a_serving_choice_is_not_another_checkpoint(engines_tmp: Path) -> None:
    """quantization.kv_skip_layers is applied by the server (vLLM --kv-cache-dtype-skip-layers): the checkpoint
    calibrated without it is still this recipe's."""
    from trtkv.recipe.layout import checkpoint_dir

    recipe = load_recipe("smollm2_fp8kv_vllm")
    stage.run_stage("calibrate", recipe, checkpoint_dir(recipe), _engine, log=lambda _m: None)
    mixed = load_recipe("smollm2_fp8kv_vllm", ["quantization.kv_skip_layers=[0,29]"])
    assert stage.input_problem(checkpoint_dir(mixed), mixed) is None
