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

from trtkv import serve
from trtkv.errors import StageError, ToolError
from trtkv.recipe import load_recipe


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _recipe(*overrides: str):  # noqa: ANN202 - Recipe
    ports = [_free_port() for _ in range(3)]
    return load_recipe("smollm2_fp8kv", [f"triton.http_port={ports[0]}", f"triton.grpc_port={ports[1]}",
                                         f"triton.metrics_port={ports[2]}", *overrides])


def _record(recipe, proc: subprocess.Popen[bytes], command: list[str]) -> None:  # noqa: ANN001
    t = recipe.triton
    serve.write_server(recipe, serve.ServerInfo(pid=proc.pid, host=t.host, http_port=t.http_port,
                                                grpc_port=t.grpc_port, metrics_port=t.metrics_port, command=command,
                                                log="/dev/null", model_repository="x", started_at="now"))


def test_gpu_dry_run_prints_container_and_mpirun(capsys: pytest.CaptureFixture[str], engines_tmp: Path) -> None:
    serve.start(load_recipe("llama70b_fp8kv"), dry_run=True)
    out = capsys.readouterr().out
    assert "docker run" in out and serve.DEFAULT_IMAGE in out and "--gpus all" in out
    assert out.count("mpirun --allow-run-as-root") == 2  # in the docker command and inside the container
    assert "--load-model=tensorrt_llm" in out and "shm-region-prefix-name=prefix3_" in out
    assert f"-v {engines_tmp / 'llama70b_fp8kv'}:{engines_tmp / 'llama70b_fp8kv'}" in out
    assert "-p 127.0.0.1:8001:8001" in out and "--world_size=4" in out
    single = serve.gpu_command(load_recipe("llama8b_fp8kv"), Path("/r"))
    assert single[0] == serve.CONTAINER_TRITONSERVER and "mpirun" not in single


def test_local_dry_run_and_environment(capsys: pytest.CaptureFixture[str], engines_tmp: Path) -> None:
    recipe = _recipe()
    serve.start(recipe, dry_run=True)
    out = capsys.readouterr().out
    assert "--disable-auto-complete-config" in out and f"--http-port={recipe.triton.http_port}" in out
    assert "--http-address=127.0.0.1" in out
    env = serve.server_env()
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
    assert env["LD_LIBRARY_PATH"].split(os.pathsep)[0] == serve.python_libdir()


def test_backend_folder_links_the_bundled_python_backend(engines_tmp: Path) -> None:
    backends = serve.prepare_backends(_recipe())
    names = sorted(p.name for p in (backends / "python").iterdir())
    assert names == ["libtriton_python.so", "triton_python_backend_stub", "triton_python_backend_utils.py"]
    assert all((backends / "python" / n).resolve().is_file() for n in names)
    serve.prepare_backends(_recipe())  # idempotent


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
        _record(recipe, proc, ["sleep", "60"])
        with pytest.raises(StageError, match="already running"):
            serve.check_free(recipe)
        assert serve.stop(recipe, timeout_s=5)
        assert proc.poll() is not None and not serve.server_json(recipe).exists()
        assert not serve.stop(recipe)
    finally:
        proc.kill()


def test_stale_record_is_cleared(engines_tmp: Path) -> None:
    recipe = _recipe()
    proc = subprocess.Popen(["true"])
    proc.wait()
    _record(recipe, proc, ["true"])
    serve.check_free(recipe)
    assert not serve.server_json(recipe).exists()


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
        serve._launch(recipe, [sys.executable, "-c", code], Path("repo"), dict(os.environ), 20, lambda _m: None)
    assert "exited with code 3" in str(info.value) and "failed to load tensorrt_llm" in str(info.value)
    assert not serve.server_json(recipe).exists()


def test_server_json_has_the_contract_fields(engines_tmp: Path) -> None:
    recipe = _recipe()
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        _record(recipe, proc, ["sleep", "30"])
        data = json.loads(serve.server_json(recipe).read_text())
        assert {"pid", "host", "http_port", "grpc_port", "metrics_port", "command", "log", "model_repository",
                "started_at"} <= set(data)
    finally:
        serve.stop(recipe, timeout_s=5)
