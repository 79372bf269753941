"""`trtkv serve` / `trtkv stop` without starting tritonserver: commands, refusals, pid bookkeeping."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trtkv.backends import bundled
from trtkv.core import sessions
from trtkv.core.errors import StageError, ToolError
from trtkv.recipe import load_recipe
from trtkv.recipe.layout import serve_dir
from trtkv.serving import launch, serve


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _recipe(*overrides: str):  # noqa: ANN202 - Recipe
    ports = [_free_port() for _ in range(3)]
    return load_recipe("smollm2_fp8kv", [f"triton.http_port={ports[0]}", f"triton.grpc_port={ports[1]}",
                                         f"triton.metrics_port={ports[2]}", *overrides])


def _record(recipe, proc: subprocess.Popen[bytes], command: list[str]) -> None:  # noqa: ANN001
    """What serve records: the pid, its session and the leader's start time (the proof that it is the server)."""
    t = recipe.triton
    launch.write_server(recipe, serve.ServerRecord(pid=proc.pid, host=t.host, http_port=t.http_port,
                                                grpc_port=t.grpc_port, metrics_port=t.metrics_port, command=command,
                                                log="/dev/null", model_repository="x", started_at="now",
                                                session_id=proc.pid, session_start=sessions.start_time(proc.pid)))


def test_gpu_dry_run_prints_container_and_mpirun(capsys: pytest.CaptureFixture[str], engines_tmp: Path) -> None:
    serve.start(load_recipe("llama70b_fp8kv"), dry_run=True)
    out = capsys.readouterr().out
    assert "docker run" in out and "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3" in out and "--gpus all" in out
    assert out.count("mpirun --allow-run-as-root") == 2  # in the docker command and inside the container
    assert "--load-model=tensorrt_llm" in out and "shm-region-prefix-name=prefix3_" in out
    # each folder the server reads, read-only at its canonical container path, which the repository's configs name
    ours = engines_tmp / "llama70b_fp8kv"
    assert f"-v {ours / 'engine'}:/models/llama70b_fp8kv/engine:ro" in out
    assert f"-v {ours / 'checkpoint/tokenizer'}:/models/llama70b_fp8kv/checkpoint/tokenizer:ro" in out
    assert ":/models/llama70b_fp8kv/triton_repo:ro" in out
    assert "--model-repository=/models/llama70b_fp8kv/triton_repo" in out and "--model_repo=/models/" in out
    assert "-p 127.0.0.1:8001:8001" in out and "--world_size=4" in out
    single = serve.gpu_command(load_recipe("llama8b_fp8kv"), Path("/r"))
    assert single[0] == serve.CONTAINER_TRITONSERVER and "mpirun" not in single


def test_local_dry_run_and_environment(capsys: pytest.CaptureFixture[str], engines_tmp: Path) -> None:
    recipe = _recipe()
    serve.start(recipe, dry_run=True)
    out = capsys.readouterr().out
    assert "--disable-auto-complete-config" in out and f"--http-port={recipe.triton.http_port}" in out
    assert "--http-address=127.0.0.1" in out
    env = bundled.server_env()
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
    assert env["LD_LIBRARY_PATH"].split(os.pathsep)[0] == bundled.python_libdir()


def test_backend_folder_links_the_bundled_python_backend(engines_tmp: Path) -> None:
    backends = bundled.prepare_backends(_recipe())
    names = sorted(p.name for p in (backends / "python").iterdir())
    assert names == ["libtriton_python.so", "triton_python_backend_stub", "triton_python_backend_utils.py"]
    assert all((backends / "python" / n).resolve().is_file() for n in names)
    bundled.prepare_backends(_recipe())  # idempotent


def test_serve_needs_repo_and_engine(engines_tmp: Path) -> None:
    with pytest.raises(StageError, match="trtkv repo"):
        serve.start(_recipe())


def test_refuses_a_taken_port(engines_tmp: Path) -> None:
    recipe = _recipe()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", recipe.triton.grpc_port))
        sock.listen()
        with pytest.raises(StageError, match=r"triton\.grpc_port"):
            serve.check_free(recipe)
    serve.check_free(recipe)


def test_already_running_then_stop(engines_tmp: Path) -> None:
    recipe = _recipe()
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        deadline = time.time() + 10  # until the child has exec'd (before, /proc shows the forking interpreter)
        while not Path(f"/proc/{proc.pid}/cmdline").read_bytes().startswith(b"sleep") and time.time() < deadline:
            time.sleep(0.01)
        _record(recipe, proc, ["sleep", "60"])
        with pytest.raises(StageError, match="already running"):
            serve.check_free(recipe)
        assert serve.stop(recipe, timeout_s=5)
        assert proc.poll() is not None and not launch.server_json(recipe).exists()
        assert not serve.stop(recipe)
    finally:
        proc.kill()


def test_stale_record_is_cleared(engines_tmp: Path) -> None:
    recipe = _recipe()
    proc = subprocess.Popen(["true"])
    proc.wait()
    _record(recipe, proc, ["true"])
    serve.check_free(recipe)
    assert not launch.server_json(recipe).exists()


def test_stop_escalates_to_sigkill(engines_tmp: Path) -> None:
    recipe = _recipe()
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ok', flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ok"
        _record(recipe, proc, [sys.executable])
        start = time.time()
        assert serve.stop(recipe, timeout_s=0.5)
        assert proc.poll() is not None and time.time() - start < 10
    finally:
        proc.kill()


def test_a_server_that_dies_reports_the_log(engines_tmp: Path) -> None:
    recipe = _recipe()
    code = "print('E1129 00:00:00.000 1 model.cc:1] \"failed to load tensorrt_llm\"'); raise SystemExit(3)"
    with pytest.raises(ToolError) as info:
        launch.start_server(recipe, [sys.executable, "-c", code], Path("repo"), dict(os.environ), 20, lambda _m: None)
    assert "exited with code 3" in str(info.value) and "failed to load tensorrt_llm" in str(info.value)
    assert not launch.server_json(recipe).exists()


def test_server_json_has_the_contract_fields(engines_tmp: Path) -> None:
    recipe = _recipe()
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        _record(recipe, proc, ["sleep", "30"])
        data = json.loads(launch.server_json(recipe).read_text())
        assert {"pid", "host", "http_port", "grpc_port", "metrics_port", "command", "log", "model_repository",
                "started_at"} <= set(data)
    finally:
        serve.stop(recipe, timeout_s=5)


# ---------------------------------------------------------------------------------------------
# GPU path: addresses, the docker container, required inputs


def test_gpu_commands_bind_the_recipe_host_and_name_the_container(engines_tmp: Path) -> None:
    recipe = load_recipe("llama70b_fp8kv")
    inside = serve.gpu_command(recipe, Path("/r"))
    assert inside.count("--http-address=127.0.0.1") == 4 and inside.count("--grpc-address=127.0.0.1") == 4
    assert inside.count("--metrics-address=127.0.0.1") == 4
    docker = serve.docker_command(recipe, Path("/r"))
    assert docker[docker.index("--name") + 1] == "trtkv-llama70b_fp8kv" == serve.container_name(recipe)
    assert "-p" in docker and "127.0.0.1:8000:8000" in docker  # published on the recipe host only ...
    assert "--http-address=0.0.0.0" in docker  # ... while the server inside binds the container's interface
    custom = serve.gpu_command(load_recipe("llama8b_fp8kv", ["triton.host=10.0.0.5"]), Path("/r"))
    assert "--http-address=10.0.0.5" in custom


def fake_docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A `docker` on PATH that records its arguments (one call per line)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "docker_calls.txt"
    script = bin_dir / "docker"
    script.write_text(f"#!{sys.executable}\nimport sys\nopen({str(calls)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return calls


def test_stop_stops_and_removes_the_container(tmp_path: Path, engines_tmp: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    calls = fake_docker(tmp_path, monkeypatch)
    recipe = _recipe()
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)  # stands for the `docker run` client
    try:
        t = recipe.triton
        cid = "e" * 64
        serve_dir(recipe).mkdir(parents=True)
        (serve_dir(recipe) / "container.cid").write_text(cid)  # what `docker run --cidfile` wrote
        launch.write_server(recipe, serve.ServerRecord(
            pid=proc.pid, host=t.host, http_port=t.http_port, grpc_port=t.grpc_port, metrics_port=t.metrics_port,
            command=["sleep", "60"], log="/dev/null", model_repository="x", started_at="now",
            container="trtkv-smollm2_fp8kv", cidfile=str(serve_dir(recipe) / "container.cid"), session_id=proc.pid,
            session_start=sessions.start_time(proc.pid)))
        said: list[str] = []
        assert serve.stop(recipe, timeout_s=5, log=said.append)
        assert calls.read_text().splitlines() == [f"top {cid} -eo pid",  # its pids: GPU memory waited on
                                                  f"stop -t 5 {cid}", f"rm -f {cid}"]  # by its id, never its name
        assert proc.poll() is not None and not launch.server_json(recipe).exists()
        assert any("stopped and removed" in line for line in said)
    finally:
        proc.kill()


def test_stop_container_without_docker_says_what_to_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from trtkv.serving.container import stop_container

    monkeypatch.setattr(serve.shutil, "which", lambda _name: None)
    done, note = stop_container("trtkv-x")
    assert not done and "docker stop trtkv-x && docker rm -f trtkv-x" in note


def test_gpu_serve_needs_the_engine_or_the_hf_export(engines_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trtkv.recipe import layout

    monkeypatch.setattr(serve.shutil, "which", lambda _name: None)  # never start docker here
    for name, produced_by in (("llama70b_fp8kv", "trtkv build"), ("llama8b_fp8kv_pytorch", "trtkv calibrate")):
        recipe = load_recipe(name, ["triton.http_port=18931", "triton.grpc_port=18932", "triton.metrics_port=18933"])
        repo = layout.repo_dir(recipe)
        repo.mkdir(parents=True)
        (repo / "manifest.json").write_text(json.dumps({"stage": "repo", "recipe": name}))
        with pytest.raises(StageError, match=produced_by):
            serve.start(recipe)
    ckpt = layout.checkpoint_dir(recipe)
    ckpt.mkdir(parents=True)
    (ckpt / "manifest.json").write_text(json.dumps({"stage": "calibrate", "recipe": recipe.name}))
    with pytest.raises(StageError, match="has no config.json"):
        serve.start(recipe)


def test_status_of_a_dead_server_is_down(engines_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """server.json left behind by a server that died: `trtkv status` says down (exit 1), never healthy."""
    from trtkv.cli import main

    recipe = load_recipe("smollm2_fp8kv")
    proc = subprocess.Popen(["true"])
    proc.wait()
    t = recipe.triton
    launch.write_server(recipe, serve.ServerRecord(pid=proc.pid, host=t.host, http_port=t.http_port,
                                                grpc_port=t.grpc_port, metrics_port=t.metrics_port, command=["true"],
                                                log="x.log", model_repository="repo", started_at="now"))
    assert main(["status", "smollm2_fp8kv"]) == 1
    assert "smollm2_fp8kv: down" in capsys.readouterr().out
    assert main(["status", "smollm2_fp8kv", "--json"]) == 1
    assert '"alive": false' in capsys.readouterr().out
