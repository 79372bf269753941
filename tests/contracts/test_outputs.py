"""Output folders: trtkv replaces only what it wrote (issue 23, items 2 and 3), and a recipe name never becomes a field
of a generated config.pbtxt (item 1, defence in depth behind the name rule)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.support.planned import deploy
from trtkv.contracts import outputs, stage
from trtkv.core.errors import StageError
from trtkv.deploy import Options, Target
from trtkv.recipe import load_recipe


def _work(tmp: Path) -> dict[str, Any]:
    (tmp / "out.txt").write_text("done\n")
    return {}


def _users_folder(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "notes.txt").write_text("mine\n")
    os.chmod(path, 0o755)
    return path


@pytest.mark.parametrize("name", [".", ".."])
def test_a_stage_never_replaces_its_parent(tmp_path: Path, name: str) -> None:
    repos = tmp_path / "triton_repo"
    (repos / "other_model").mkdir(parents=True)
    (repos / "other_model" / "config.pbtxt").write_text("kept\n")
    output = Path(f"{repos}/{name}")  # pathlib drops a trailing "." (the folder itself): refused as not trtkv's
    with pytest.raises(StageError, match="strictly inside its parent" if name == ".." else "files trtkv did not write"):
        stage.run_stage("repo", load_recipe("smollm2_fp8kv"), output, _work, log=lambda _m: None)
    assert (repos / "other_model" / "config.pbtxt").read_text() == "kept\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["triton_repo"]


def test_a_symlinked_output_is_refused(tmp_path: Path) -> None:
    target = _users_folder(tmp_path / "elsewhere")
    (tmp_path / "engine").symlink_to(target)
    with pytest.raises(StageError, match="symbolic link"):
        stage.run_stage("build", load_recipe("smollm2_fp8kv"), tmp_path / "engine", _work, log=lambda _m: None)
    assert (target / "notes.txt").read_text() == "mine\n"


def test_a_folder_trtkv_did_not_write_is_refused_and_kept(tmp_path: Path) -> None:
    mine = _users_folder(tmp_path / "results")
    with pytest.raises(StageError, match=r"files trtkv did not write .*Nothing was changed"):
        stage.run_stage("bench", load_recipe("smollm2_fp8kv"), mine, _work, log=lambda _m: None)
    assert (mine / "notes.txt").read_text() == "mine\n" and (mine.stat().st_mode & 0o777) == 0o755


def test_another_stage_or_recipe_is_refused_the_same_stage_replaced_keeping_the_mode(tmp_path: Path) -> None:
    recipe = load_recipe("smollm2_fp8kv")
    out = tmp_path / "bench"
    stage.run_stage("bench", recipe, out, _work, force=True, log=lambda _m: None)
    os.chmod(out, 0o750)
    stage.run_stage("bench", recipe, out, _work, force=True, log=lambda _m: None)
    assert (out / "out.txt").is_file() and (out.stat().st_mode & 0o777) == 0o750
    with pytest.raises(StageError, match=r"trtkv's `bench` output of recipe 'smollm2_fp8kv'"):
        stage.run_stage("build", recipe, out, _work, log=lambda _m: None)
    with pytest.raises(StageError, match="recipe 'smollm2_fp8kv'"):
        stage.run_stage("bench", load_recipe("smollm2_int8kv"), out, _work, force=True, log=lambda _m: None)


def test_deploy_output_refuses_a_users_folder_and_keeps_its_own_mode(tmp_path: Path) -> None:
    recipe = load_recipe("llama70b_fp8kv")
    mine = _users_folder(tmp_path / "cluster")
    with pytest.raises(StageError, match="files trtkv did not write"):
        deploy(recipe, Target.K8S, mine, log=lambda _m: None, options=Options(model_source="s3://my-bucket/x"))
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"] and (mine.stat().st_mode & 0o777) == 0o755
    out = deploy(recipe, Target.K8S, tmp_path / "k8s", log=lambda _m: None, options=Options(model_source="s3://my-bucket/x"))
    assert (out.stat().st_mode & 0o777) == 0o777 & ~_umask(), "a new folder gets the umask's mode, not mkdtemp's 0700"
    os.chmod(out, 0o750)
    (out / "README.md").write_text("stale")
    # its own earlier output (same target): replaced, mode kept
    deploy(recipe, Target.K8S, out, log=lambda _m: None, options=Options(model_source="s3://my-bucket/x"))
    assert (out / "README.md").read_text() != "stale" and (out.stat().st_mode & 0o777) == 0o750
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cluster", "k8s"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_bench_refuses_its_output_before_measuring(tmp_path: Path) -> None:
    from trtkv.bench.runner import BenchOptions, run_bench

    mine = _users_folder(tmp_path / "results")
    opts = BenchOptions(url="127.0.0.1:9", output=mine, progress=False)  # nothing listens: the folder is checked first
    with pytest.raises(StageError, match=r"bench: --output .*files trtkv did not write"):
        run_bench(load_recipe("smollm2_fp8kv"), opts)
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


def test_probe_and_compare_outputs_are_claimed_or_refused(tmp_path: Path) -> None:
    from trtkv.probe.sweep import probe_output

    recipe = load_recipe("smollm2_fp8kv")
    with pytest.raises(StageError, match="probe: --output"):
        probe_output(recipe, _users_folder(tmp_path / "mine"))
    fresh = probe_output(recipe, tmp_path / "probe")
    assert (fresh / outputs.OWNER).is_file()
    assert probe_output(recipe, fresh) == fresh  # a resumed probe of the same recipe
    with pytest.raises(StageError, match="`probe` output of recipe 'smollm2_fp8kv'"):
        probe_output(load_recipe("smollm2_int8kv"), fresh)
    with pytest.raises(StageError, match="compare: --output"):
        outputs.in_place_output(tmp_path / "mine", tmp_path / "unused", "compare", "compare")


@pytest.mark.parametrize("name", [".", "..", "a/b", ".hidden", "x\ny"])
def test_a_recipe_name_that_is_not_one_folder_name_gets_no_folder(engines_tmp: Path, name: str) -> None:
    from trtkv.recipe import layout

    recipe = load_recipe("smollm2_fp8kv")
    recipe._name = name  # past the loader's name rule: the folder helpers refuse it too
    for folder in (layout.repo_dir, layout.engine_dir, layout.checkpoint_dir):
        with pytest.raises(StageError, match="not a plain folder name"):
            folder(recipe)


def test_a_hostile_recipe_name_adds_no_field_to_a_config(engines_tmp: Path, smollm2_dir: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The name rule and the folder helpers refuse such names; here both are forced past, and the generated
    repository must still hold exactly the fields it always has, with the paths read back whole."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    from trtkv.core import paths
    from trtkv.repo.generate import plan_repo, write_models

    recipe = load_recipe("smollm2_fp8kv")
    normal = _parameters(recipe, tmp_path=engines_tmp / "normal")
    hostile = 'x" } }\nparameters: { key: "evil" value: { string_value: "1'
    recipe._name = hostile
    monkeypatch.setattr(paths, "recipe_folder", lambda root, name: root / name)
    plan = plan_repo(recipe)
    target = engines_tmp / "hostile"
    write_models(plan, target)
    for config in target.glob("*/config.pbtxt"):
        parsed = text_format.Parse(config.read_text(), model_config_pb2.ModelConfig())
        assert "evil" not in parsed.parameters, config
        assert set(parsed.parameters) == normal[config.parent.name], config
    llm = text_format.Parse((target / "tensorrt_llm" / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    assert llm.parameters["engine_dir"].string_value == str(plan.engine_dir)
    assert hostile in str(plan.engine_dir)


def _parameters(recipe: Any, tmp_path: Path) -> dict[str, set[str]]:
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    from trtkv.repo.generate import plan_repo, write_models

    write_models(plan_repo(recipe), tmp_path)
    return {c.parent.name: set(text_format.Parse(c.read_text(), model_config_pb2.ModelConfig()).parameters)
            for c in tmp_path.glob("*/config.pbtxt")}
