"""Paths in the files `trtkv deploy` writes (issue 48): pyxis's mount list has no escaping, so a ',' or ':' in a path
is refused at render time, by the job itself (for the folders sbatch is given) and by the deploy check, which reads the
list as pyxis splits it; and every path in a README's shell lines is quoted, so a folder with a space is one word."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from tests.support.planned import deploy, size
from trtkv.core.apikey import API_KEY_ENV
from trtkv.core.errors import StageError
from trtkv.deploy import Options, Target, check, render, slurm
from trtkv.recipe import load_recipe

OPTS = Options(model_source="s3://my-bucket/trtkv")


def quiet(_m: str) -> None:
    pass


@pytest.mark.parametrize("folder", ["a,b", "a:b"])
def test_a_comma_or_colon_in_the_slurm_output_is_refused(tmp_path: Path, folder: str) -> None:
    """Before: deploy wrote the job and said its checks passed, and pyxis read `/x/a,b:/models/...` as two mounts."""
    out = tmp_path / folder / "slurm"
    with pytest.raises(StageError) as err:
        deploy(load_recipe("llama70b_fp8kv"), Target.SLURM, out, log=quiet)
    assert slurm.MOUNT_RULE in str(err.value) and repr(str(out)) in str(err.value)
    assert not out.exists()


def test_a_comma_in_the_engines_folder_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRTKV_ENGINES", str(tmp_path / "e,1"))
    with pytest.raises(StageError, match=r"TRTKV_ENGINES.*holds ','"):
        deploy(load_recipe("llama70b_fp8kv"), Target.SLURM, tmp_path / "slurm", log=quiet)


def test_the_deploy_check_reads_the_mount_list_as_pyxis_splits_it(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The render-time refusal bypassed: the check alone still finds the extra mounts (defence in depth)."""
    monkeypatch.setattr(slurm, "check_mount_paths", lambda *_a: None, raising=False)
    recipe = load_recipe("llama70b_fp8kv")
    for folder, seen in (("a,b", "pyxis reads 5 mounts where the job names 4"), ("a:b", "not /SRC:/DST:ro")):
        out = tmp_path / folder
        out.mkdir()
        files, _body = render(recipe, Target.SLURM, size(recipe), out)
        for name, text in files.items():
            (out / name).write_text(text)
        _checked, problems = check.check_folder(out)
        assert any(seen in p for p in problems), problems
    good = tmp_path / "good"
    out = deploy(recipe, Target.SLURM, good, log=quiet)
    assert "job.sbatch: --container-mounts read as pyxis splits it" in (out / "README.md").read_text()


def test_the_job_refuses_folders_given_with_a_comma(tmp_path: Path) -> None:
    out = deploy(load_recipe("llama70b_fp8kv"), Target.SLURM, tmp_path / "slurm", log=quiet)
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for tool in ("srun", "scontrol"):
        (stubs / tool).write_text("#!/bin/sh\necho node1\n")
        (stubs / tool).chmod(0o755)
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "SLURM_JOB_NODELIST": "node1", "TRTKV_ENGINES": "/shared/a,b",
           API_KEY_ENV: "sentinel-key"}
    job = subprocess.run(["bash", str(out / slurm.JOB_SCRIPT)], env=env, capture_output=True, text=True, timeout=30)
    assert job.returncode == 1 and "split pyxis's --container-mounts list" in job.stderr
    ok = subprocess.run(["bash", str(out / slurm.JOB_SCRIPT)], env={**env, "TRTKV_ENGINES": "/shared/ab"},
                        capture_output=True, text=True, timeout=30)
    assert ok.returncode == 0, ok.stderr


@pytest.mark.parametrize("target, files", [(Target.K8S, ["models.yaml", "server.yaml"]),
                                           (Target.DYNAMO, ["models.yaml", "agg.yaml"])])
def test_the_readme_quotes_every_path_of_its_kubectl_lines(tmp_path: Path, target: Target, files: list[str]) -> None:
    """Before: `kubectl apply -f /x/my deploys/k8s/models.yaml` (two words: kubectl applies `/x/my`)."""
    name = "llama70b_fp8kv_llmapi" if target is Target.DYNAMO else "llama70b_fp8kv"
    out = deploy(load_recipe(name), target, tmp_path / "my deploys; x" / target.value, log=quiet, options=OPTS)
    applied = [shlex.split(line, comments=True) for line in (out / "README.md").read_text().splitlines()
               if line.startswith("kubectl apply -f")]
    assert [words[3:] for words in applied] == [[str(out / f)] for f in files]
