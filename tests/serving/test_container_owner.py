"""`trtkv serve` of a GPU recipe touches a docker container only when it is proven this checkout's (issue 48): the
label trtkv.owner of this serve/ folder and the id recorded in serve/container.cid. Another checkout's or another
user's `trtkv-<recipe>` is refused before the start and left alone after a failed one. docker is a fake script on PATH
that records every call and keeps its containers in a JSON file; the rest of `serve.start` runs as it is. serve writes
its logs only into a real serve/ folder, never through a symbolic link planted at a log's name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trtkv.backends import for_recipe
from trtkv.core.errors import StageError, TrtkvError
from trtkv.recipe import load_recipe
from trtkv.recipe.layout import serve_dir
from trtkv.serving import container, owner, serve

RECIPE = "llama70b_fp8kv"
PORTS = ["triton.http_port=18941", "triton.grpc_port=18942", "triton.metrics_port=18943",
         "triton.startup_timeout_s=20"]
FAKE_DOCKER = r'''
import json, sys
state_path, calls_path = sys.argv[1], sys.argv[2]
args = sys.argv[3:]
open(calls_path, "a").write(" ".join(args) + "\n")
state = json.load(open(state_path))
if args[0] == "inspect":
    found = state.get(args[-1])
    if found is None:
        sys.stderr.write("Error: No such container: " + args[-1] + "\n")
        sys.exit(1)
    print(found["id"], found["label"] or "<no value>")
elif args[0] in ("stop", "rm"):
    target = args[-1]
    state = {k: v for k, v in state.items() if target not in (k, v["id"])}
    json.dump(state, open(state_path, "w"))
elif args[0] == "run":
    if state.get("race"):  # another user's container of that name appears as this run starts
        state["trtkv-llama70b_fp8kv"] = state.pop("race")
        json.dump(state, open(state_path, "w"))
        sys.stderr.write("docker: Error response from daemon: Conflict. The container name is already in use\n")
        sys.exit(125)
    sys.stderr.write("docker: no GPU here\n")
    sys.exit(125)
'''


class Docker:
    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        self.state, self.calls = tmp_path / "docker_state.json", tmp_path / "docker_calls.txt"
        self.state.write_text("{}")
        (tmp_path / "fake_docker.py").write_text(FAKE_DOCKER)
        script = bin_dir / "docker"
        script.write_text(f"#!/bin/sh\nexec {sys.executable} {tmp_path / 'fake_docker.py'} {self.state} {self.calls} "
                          '"$@"\n')
        script.chmod(0o755)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    def holds(self, key: str, cid: str, label: str) -> None:
        state = json.loads(self.state.read_text())
        state[key] = {"id": cid, "label": label}
        self.state.write_text(json.dumps(state))

    def said(self) -> list[str]:
        return self.calls.read_text().splitlines() if self.calls.exists() else []

    def touched(self) -> list[str]:
        return [c for c in self.said() if c.split()[0] in ("stop", "rm", "kill")]


@pytest.fixture()
def gpu_serve(engines_tmp: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """serve.start of a GPU recipe with its inputs taken as built (the docker path is what is tested)."""
    monkeypatch.setattr(serve, "require_input", lambda *_a, **_k: None)
    monkeypatch.setattr(serve, "require_made_from", lambda *_a, **_k: None)
    recipe = load_recipe(RECIPE, PORTS)
    monkeypatch.setattr(type(for_recipe(recipe).serving), "require_input", lambda *_a, **_k: None)
    return recipe


OTHER = "u4242-0123456789abcdef"  # another user's (or checkout's) label
CID = "c" * 64


@pytest.mark.parametrize("label", [OTHER, ""])
def test_another_checkouts_container_is_refused_untouched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          gpu_serve, label: str) -> None:  # type: ignore[no-untyped-def]
    """Before: `docker stop -t 10 trtkv-<recipe>` and `docker rm -f trtkv-<recipe>` ended whoever's it was."""
    docker = Docker(tmp_path, monkeypatch)
    docker.holds("trtkv-llama70b_fp8kv", CID, label)
    with pytest.raises(StageError) as err:
        serve.start(gpu_serve, log=lambda _m: None)
    said = str(err.value)
    assert "trtkv-llama70b_fp8kv" in said and CID[:12] in said and "leaves it alone" in said
    assert "docker stop trtkv-llama70b_fp8kv && docker rm trtkv-llama70b_fp8kv" in said  # the next step
    assert docker.touched() == [] and not any(c.startswith("run") for c in docker.said())


def test_a_container_with_this_label_but_not_the_recorded_id_is_refused(tmp_path: Path, gpu_serve,  # type: ignore[no-untyped-def]
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    docker = Docker(tmp_path, monkeypatch)
    folder = serve_dir(gpu_serve)
    docker.holds("trtkv-llama70b_fp8kv", CID, owner.owner_id(folder))
    folder.mkdir(parents=True)
    (folder / container.CIDFILE).write_text("d" * 64)
    with pytest.raises(StageError, match="leaves it alone"):
        serve.start(gpu_serve, log=lambda _m: None)
    assert docker.touched() == []


def test_a_failed_start_leaves_anothers_container_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        gpu_serve) -> None:  # type: ignore[no-untyped-def]
    """`docker run` fails because a same-named container appeared meanwhile: no id was recorded, so the cleanup finds
    the container only by name, and it is not this checkout's. Before: stopped and removed by name."""
    docker = Docker(tmp_path, monkeypatch)
    docker.holds("race", CID, OTHER)
    said: list[str] = []
    with pytest.raises(TrtkvError, match="exited with code 125"):
        serve.start(gpu_serve, log=said.append)
    assert docker.touched() == [], docker.said()
    assert any("leaves it alone" in line for line in said)


def test_this_checkouts_leftover_is_replaced_and_its_new_container_labelled(tmp_path: Path, gpu_serve,  # type: ignore[no-untyped-def]
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    docker = Docker(tmp_path, monkeypatch)
    folder = serve_dir(gpu_serve)
    folder.mkdir(parents=True)
    (folder / container.CIDFILE).write_text(CID + "\n")
    docker.holds("trtkv-llama70b_fp8kv", CID, owner.owner_id(folder))
    with pytest.raises(TrtkvError, match="exited with code 125"):  # no GPU here: the fake run fails
        serve.start(gpu_serve, log=lambda _m: None)
    assert docker.touched() == [f"stop -t 10 {CID}", f"rm -f {CID}"]  # by its id, never by the name
    run = next(c for c in docker.said() if c.startswith("run")).split()
    assert run[run.index("--label") + 1] == f"trtkv.owner={owner.owner_id(folder)}"
    assert owner.owner_id(folder).startswith(f"u{os.getuid()}-")
    assert owner.owner_id(tmp_path / "another" / "serve") != owner.owner_id(folder)


def test_stop_of_a_record_without_an_id_stops_only_a_proven_container(tmp_path: Path, engines_tmp: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from trtkv.serving import teardown

    docker = Docker(tmp_path, monkeypatch)
    recipe = load_recipe(RECIPE, PORTS)
    folder = serve_dir(recipe)
    folder.mkdir(parents=True)
    docker.holds("trtkv-llama70b_fp8kv", CID, OTHER)
    gone = subprocess.Popen(["true"])  # the `docker run` client, exited
    gone.wait()
    record = serve.ServerRecord(pid=gone.pid, host="127.0.0.1", http_port=1, grpc_port=2, metrics_port=3,
                                command=["docker", "run"], log="/dev/null", model_repository="x", started_at="now",
                                container="trtkv-llama70b_fp8kv", session_start=1)
    said: list[str] = []
    stopped = teardown.end_server(record, 1.0, said.append, folder)
    assert docker.touched() == [] and stopped.done and not stopped.container_done
    assert any("leaves it alone" in line for line in said)


# ---------------------------------------------------------------------------------------------
# serve writes its log only into a real serve/ folder, never through a symbolic link


def test_a_symlink_at_the_log_path_is_refused_and_the_file_it_names_kept(tmp_path: Path, gpu_serve,  # type: ignore[no-untyped-def]
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: `log_path.open("wb")` followed the link and truncated the file it named (here outside serve/)."""
    docker = Docker(tmp_path, monkeypatch)
    folder = serve_dir(gpu_serve)
    folder.mkdir(parents=True)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (folder / "tritonserver.log").symlink_to(victim)
    with pytest.raises(StageError, match=r"tritonserver.log is a symbolic link.*Next: remove the link"):
        serve.start(gpu_serve, log=lambda _m: None)
    assert victim.read_text() == "precious\n"
    assert not any(c.startswith("run") for c in docker.said())


def test_a_symlinked_serve_folder_is_refused(tmp_path: Path, gpu_serve,  # type: ignore[no-untyped-def]
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    docker = Docker(tmp_path, monkeypatch)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    serve_dir(gpu_serve).parent.mkdir(parents=True)
    serve_dir(gpu_serve).symlink_to(elsewhere)
    with pytest.raises(StageError, match=r"serve is a symbolic link"):
        serve.start(gpu_serve, log=lambda _m: None)
    assert list(elsewhere.iterdir()) == [] and not any(c.startswith("run") for c in docker.said())


def test_the_supervisor_log_is_never_written_through_a_link(tmp_path: Path) -> None:
    from trtkv.serving import launch

    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / "supervisor.log").symlink_to(victim)
    with pytest.raises(StageError, match="is a symbolic link"):
        launch.open_log(tmp_path / "supervisor.log", append=True)
    with launch.open_log(tmp_path / "own.log", append=True) as fh:
        fh.write(b"a\n")
    with launch.open_log(tmp_path / "own.log", append=True) as fh:
        fh.write(b"b\n")
    assert (tmp_path / "own.log").read_bytes() == b"a\nb\n" and victim.read_text() == "precious\n"
