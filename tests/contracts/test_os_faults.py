"""OS faults and the audit's smaller items (issue 42, items 6 and 7): every OS error is one line naming the path and
the next step; temporary siblings have names that fit and the next run of the same stage sweeps them; deploy's
replica count fits Kubernetes' int32 and a deploy never replaces another target's folder; `triton.host=::` is an
address; `trtkv report` leaves a mistyped results.json out.

The read-only and full-disk cases mount a real tmpfs where this machine allows it (root with CAP_SYS_ADMIN, as in
the project's CI container); elsewhere they are skipped and the errno table is still checked line by line."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.planned import deploy
from trtkv.cli import main
from trtkv.contracts import stage
from trtkv.core import paths
from trtkv.core.errors import StageError, os_error_line
from trtkv.deploy import Options, Target
from trtkv.recipe import load_recipe

SOURCE = Options(model_source="s3://my-bucket/trtkv")  # where the k8s loader Job copies the model from
DEPLOY_K8S = ["deploy", "llama70b_fp8kv", "--target", "k8s", "--model-source", "s3://my-bucket/trtkv"]

LONG = "o" * 250  # a legal name: 250 bytes (NAME_MAX is 255)


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_a_legal_250_byte_output_is_written_and_its_leftovers_swept(tmp_path: Path) -> None:
    """Before: `.<name>.tmp-<pid>` of a 250-byte name is over 255 bytes: the stage could never write it."""
    recipe = load_recipe("smollm2_fp8kv")
    out = tmp_path / LONG
    leftover = paths.temp_sibling(out, "tmp", pid=_dead_pid())
    assert len(leftover.name.encode()) <= 255 and leftover.name.startswith(".ooo") and "~" in leftover.name
    leftover.mkdir()
    other = paths.temp_sibling(tmp_path / ("p" * 250), "tmp", pid=_dead_pid())  # another output's: kept
    other.mkdir()
    said: list[str] = []
    result = stage.run_stage("repo", recipe, out, lambda tmp: (tmp / "a.txt").write_text("a") and {}, log=said.append)
    assert (out / "a.txt").read_text() == "a" and not result.skipped
    assert not leftover.exists() and other.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([LONG, other.name])


def test_deploy_writes_a_250_byte_output_and_sweeps_killed_runs(tmp_path: Path) -> None:
    """Before: killed deploys left `.k8s.tmp-XXXXXXXX` folders (tempfile.mkdtemp) that nothing removed."""
    recipe = load_recipe("llama70b_fp8kv")
    out = tmp_path / LONG
    killed = paths.temp_sibling(out, "tmp", pid=_dead_pid())
    killed.mkdir()
    said: list[str] = []
    deploy(recipe, Target.K8S, out, log=said.append, options=SOURCE)
    assert (out / "server.yaml").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == [LONG] and any("removed" in line for line in said)
    short = tmp_path / "k8s"
    old_random, fresh = tmp_path / ".k8s.tmp-ab3_x9kq", tmp_path / ".k8s.tmp-zz7_q1wm"  # an older trtkv's mkdtemp
    old_random.mkdir()
    fresh.mkdir()  # a run in progress right now: kept
    hour_ago = time.time() - 7200
    os.utime(old_random, (hour_ago, hour_ago))
    deploy(recipe, Target.K8S, short, log=said.append, options=SOURCE)
    assert not old_random.exists() and fresh.exists()


def test_a_deploy_never_replaces_another_targets_folder(tmp_path: Path) -> None:
    recipe = load_recipe("llama70b_fp8kv")
    out = deploy(recipe, Target.K8S, tmp_path / "site", log=lambda _m: None, options=SOURCE)
    with pytest.raises(StageError, match="for target k8s, so trtkv will not replace it"):
        deploy(recipe, Target.SLURM, out, log=lambda _m: None)
    assert (out / "server.yaml").is_file()
    deploy(recipe, Target.K8S, out, log=lambda _m: None, options=SOURCE)  # its own target: replaced


def test_replicas_fit_kubernetes_int32(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: --replicas 3000000000 was written over Kubernetes' int32 limit and its checks "passed"."""
    for flag in ("--replicas", "--target-concurrency"):
        assert main([*DEPLOY_K8S, "--output", str(tmp_path / "r"), flag,
                     "3000000000"]) == StageError.exit_code
        assert "1..2,147,483,647" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_an_ipv6_host_override_is_an_address() -> None:
    """Before: `triton.host=::` parsed as the YAML mapping {':': None}."""
    assert load_recipe("smollm2_fp8kv", ["triton.host=::"]).triton.host == "::"
    assert load_recipe("smollm2_fp8kv", ["triton.host=::1"]).triton.host == "::1"
    assert load_recipe("smollm2_fp8kv", ["bench.concurrency=[1, 8]"]).bench.concurrency == [1, 8]


@pytest.mark.parametrize("results", [{"levels": {"concurrency=1": []}},
                                     {"levels": {"concurrency=1": {"time_to_first_token": "fast"}}},
                                     {"levels": {"concurrency=1": {"request_count": {"failed": "x"}}}},
                                     {"levels": [], "accuracy": {"quiz": {"accuracy": "high"}}},
                                     {"levels": {"c=1": {"output_token_throughput": {"avg": [1]}}}, "slo": "passed"}])
def test_report_leaves_a_mistyped_results_json_out(engines_tmp: Path, results: dict[str, object]) -> None:
    """Before: a results.json of another shape crashed `trtkv report`, which promises to leave unreadable files
    out."""
    recipe = load_recipe("smollm2_fp8kv")
    bench = engines_tmp / recipe.name / "bench"
    bench.mkdir(parents=True)
    (bench / "results.json").write_text(json.dumps(results))
    assert main(["report", "smollm2_fp8kv"]) == 0
    report = json.loads((engines_tmp / recipe.name / "report" / "report.json").read_text())
    assert all(not isinstance(v, (str, list)) or k == "level" for k, v in report.get("bench", {}).items())


@pytest.mark.parametrize(("code", "words"), [
    (errno.EROFS, "the file system is read-only (EROFS). Next: write elsewhere"),
    (errno.ENOSPC, "no space left on the device (ENOSPC). Next: free space"),
    (errno.ENAMETOOLONG, "longer than the file system allows (255 bytes per name) (ENAMETOOLONG). Next: use a shorter"),
    (errno.EACCES, "permission denied (EACCES). Next: check the owner and mode"),
    (errno.EDQUOT, "quota"),
])
def test_each_os_error_is_one_line_with_the_path_and_the_next_step(code: int, words: str) -> None:
    line = os_error_line(OSError(code, os.strerror(code), "/data/engines/x"))
    assert line.startswith("/data/engines/x: ") and words in line and "\n" not in line


def test_a_permission_fault_in_a_stage_is_one_error_line(engines_tmp: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """(root ignores modes, so the fault is injected where the stage creates its temporary folder.)"""
    real = Path.mkdir

    def denied(self: Path, *args: object, **kwargs: object) -> None:
        if ".tmp-" in self.name:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "mkdir", denied)
    assert main([*DEPLOY_K8S, "--output", str(engines_tmp / "d")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "permission denied (EACCES)" in err
    assert ".d.tmp-" in err


def test_a_name_too_long_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*DEPLOY_K8S, "--output", str(tmp_path / ("n" * 300))]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "(ENAMETOOLONG). Next: use a shorter --output" in err


@pytest.fixture()
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs (a real file system to make full or read-only), where this machine may mount one."""
    mount = tmp_path / f"fs-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip()[:80]}); the errno lines are checked above")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_and_a_read_only_mount_are_one_error_line(tmpfs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmpfs / "ballast").write_bytes(b"\0" * 60 * 1024)  # nearly full: a deploy's files do not fit
    assert main([*DEPLOY_K8S, "--output", str(tmpfs / "k8s")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no space left on the device (ENOSPC)" in err and str(tmpfs) in err
    assert sorted(p.name for p in tmpfs.iterdir()) == ["ballast"]  # no half-written folder
    (tmpfs / "ballast").unlink()
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    assert main([*DEPLOY_K8S, "--output", str(tmpfs / "k8s")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the file system is read-only (EROFS)" in err
