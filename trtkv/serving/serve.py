"""Start and stop Triton for a recipe.

CPU (backend `reference`): the `tritonserver` binary bundled in the `nvidia-pytriton` wheel, with a Python-backend
folder built under engines/<recipe>/serve/backends, the venv's bin first on PATH (the backend stub finds its
interpreter through `python3`) and LD_LIBRARY_PATH set to the venv interpreter's own LIBDIR (so the stub loads the
libpython this Python was built with). GPU backends served by Triton (`tensorrt`, `llmapi`): the NVIDIA Triton
TensorRT-LLM container, one tritonserver per rank under `mpirun` when tp x pp > 1 (what the backend's
launch_triton_server.py runs). `vllm` and `sglang` start their own OpenAI server (the backend's serving part).
The server runs in its own session, so `trtkv serve` returns; engines/<recipe>/serve/server.json records pid, ports,
command, log and the session (id, leader start time, environment marker: trtkv.core.sessions), and `trtkv stop`
(and a failed or interrupted start, and every supervisor restart) ends the whole session, whether or not its leader
still runs, then waits until the GPU memory its processes held is free (trtkv.serving.teardown: stop_server, stop).
Through docker the container is named `trtkv-<recipe>` and its id recorded (`--cidfile`): stopping runs `docker stop`
then `docker rm -f` on that id, since killing the `docker run` client alone would leave the container running.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path

from trtkv.backends import for_recipe
from trtkv.contracts.artifacts import Manifest, ServerRecord
from trtkv.contracts.stage import require_input, require_made_from, tool_versions
from trtkv.core import sessions
from trtkv.core.errors import StageError, ToolError
from trtkv.core.process import port_in_use, wait_http_ready
from trtkv.core.tools import quote, tail
from trtkv.recipe import Recipe
from trtkv.recipe.layout import HF, checkpoint_dir, container_artifacts, engine_dir, host_artifacts, repo_dir, serve_dir
from trtkv.serving.container import (
    CIDFILE,
    CONTAINER_TRITONSERVER,
    container_name,
    docker_command,
    gpu_command,
    inside_repo,
    launch_script_command,
    shell_block,
    stop_container,
    trtllm_serve_command,
    trtllm_serve_docker_command,
    trtllm_serve_server,
    with_cidfile,
)
from trtkv.serving.teardown import STOP_GRACE_S, end_server, refusal, running, stop_server
from trtkv.serving.teardown import stop as stop  # `trtkv stop` and the chain call serve.stop

# The Triton TensorRT-LLM image comes from trtkv's version matrix (trtkv.platform.versions, data/trtllm_versions.json): the one
# that ships the TensorRT-LLM the engine was built with (engine manifest), else the recipe's build.tensorrt_llm_version.
SERVER_JSON = "server.json"
STUB_FILES = ("libtriton_python.so", "triton_python_backend_utils.py")


# ---------------------------------------------------------------------------------------------
# Where things are


def server_json(recipe: Recipe) -> Path:
    return serve_dir(recipe) / SERVER_JSON


def bundled_triton() -> Path:
    """pytriton/tritonserver inside the installed nvidia-pytriton wheel."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise StageError("the tritonserver bundled in nvidia-pytriton is not installed. "
                         "Next: `make install` (it installs nvidia-pytriton==0.7.0).")
    root = Path(next(iter(spec.submodule_search_locations))) / "tritonserver"
    if not (root / "bin" / "tritonserver").is_file():
        raise StageError(f"{root / 'bin' / 'tritonserver'} is missing. Next: reinstall nvidia-pytriton.")
    return root


def python_tag() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def python_libdir() -> str:
    """The running interpreter's LIBDIR (where its own libpython lives)."""
    return str(sysconfig.get_config_var("LIBDIR") or "")


def prepare_backends(recipe: Recipe) -> Path:
    """engines/<recipe>/serve/backends/python/: links to the bundled Python backend and this Python's stub."""
    return link_python_backend(serve_dir(recipe) / "backends")


def link_python_backend(backends: Path) -> Path:
    """A --backend-directory at `backends` whose python/ links the bundled Python backend and this Python's stub."""
    root = bundled_triton()
    stub = root / "python_backend_stubs" / python_tag() / "triton_python_backend_stub"
    if not stub.is_file():
        found = sorted(p.name for p in (root / "python_backend_stubs").iterdir())
        raise StageError(f"nvidia-pytriton has no Python backend stub for Python {python_tag()} (it has {found}). "
                         f"Next: make the venv with one of those Python versions.")
    python = backends / "python"
    python.mkdir(parents=True, exist_ok=True)
    targets = {name: root / "backends" / "python" / name for name in STUB_FILES}
    targets["triton_python_backend_stub"] = stub
    for name, target in targets.items():
        link = python / name
        if link.is_symlink() or link.exists():
            if link.is_symlink() and Path(os.readlink(link)) == target:
                continue
            link.unlink()
        link.symlink_to(target)
    return backends


def server_env() -> dict[str, str]:
    """PATH with the venv's bin first, LD_LIBRARY_PATH with this interpreter's LIBDIR first (Triton's Python
    backend stub links libpython: scripts/check_system.py)."""
    env = dict(os.environ)
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bin_dir, env.get("PATH", "")])
    libdir = python_libdir()
    if libdir:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in [libdir, env.get("LD_LIBRARY_PATH", "")] if p)
    return env


# ---------------------------------------------------------------------------------------------
# Commands


def bundled_command(repo: Path, backends: Path, host: str, ports: tuple[int, int, int],
                    extra: tuple[str, ...] = ()) -> list[str]:
    """The bundled (CPU) tritonserver on `repo`: the one command builder for `trtkv serve` and the test server."""
    http, grpc, metrics = ports
    return [
        str(bundled_triton() / "bin" / "tritonserver"),
        f"--model-repository={repo}",
        f"--backend-directory={backends}",
        f"--http-address={host}", f"--http-port={http}",
        f"--grpc-address={host}", f"--grpc-port={grpc}",
        f"--metrics-address={host}", f"--metrics-port={metrics}",
        "--allow-gpu-metrics=false",
        "--pinned-memory-pool-byte-size=0",
        *extra,
    ]


def local_command(recipe: Recipe, repo: Path, backends: Path) -> list[str]:
    """The bundled tritonserver on the recipe's host and ports."""
    t = recipe.triton
    return bundled_command(repo, backends, t.host, (t.http_port, t.grpc_port, t.metrics_port),
                           ("--disable-auto-complete-config", "--exit-on-error=true", "--exit-timeout-secs=10"))


def read_server(recipe: Recipe) -> ServerRecord | None:
    """The recorded server (None when there is none); StageError when server.json is unreadable."""
    return ServerRecord.load(serve_dir(recipe))


def write_server(recipe: Recipe, info: ServerRecord) -> Path:
    return info.save(serve_dir(recipe))


def write_serve_manifest(recipe: Recipe, info: ServerRecord) -> Path:
    """serve/manifest.json (every stage folder has one): the server started, how and how fast it became ready."""
    return Manifest(stage="serve", recipe=recipe.name, key=None, wall_seconds=info.ready_seconds, backend=info.backend,
                    command=info.command, model_repository=info.model_repository, started_at=info.started_at,
                    container=info.container, tool_versions=tool_versions()).save(serve_dir(recipe))


def check_free(recipe: Recipe, log: Callable[[str], None] = print) -> None:
    """Refuse when a server for the recipe is recorded and alive, or one of its ports is taken; the leftovers of a
    recorded server that died (its session's other processes) are ended first."""
    info = read_server(recipe)
    if info is not None:
        if running(info):
            raise StageError(f"a server for recipe {recipe.name} is already running (pid {info.pid}, "
                             f"{info.http_url}, log {info.log}). Next: use it, or `trtkv stop {recipe.name}` first.")
        left = stop_server(recipe, timeout_s=STOP_GRACE_S, log=log)
        if left is not None and not left.done:
            raise StageError(f"the last server for {recipe.name} (pid {info.pid}): {refusal(info, left, server_json(recipe))}")
    t = recipe.triton
    for field_name, port in (("http_port", t.http_port), ("grpc_port", t.grpc_port), ("metrics_port", t.metrics_port)):
        if port_in_use(t.host, port):
            raise StageError(f"port {port} (recipe triton.{field_name}) on {t.host} is already in use by another "
                             f"program. Next: stop it, or pick a free port: `trtkv serve {recipe.name} "
                             f"triton.{field_name}=<port>`.")


HARMLESS = ("CUDA", "Cuda", "cuda", "NVML", "GPU")


def log_errors(path: Path, limit: int = 10) -> str:
    """The server log's error lines (E...), leaving out the CUDA/NVML noise of a CPU-only machine."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    errors = [ln for ln in lines if (ln.startswith("E") and ln[1:5].isdigit() or ln.startswith("error:"))
              and not any(word in ln for word in HARMLESS)]
    return "\n".join(errors[-limit:])


def _failure(headline: str, info: ServerRecord) -> ToolError:
    errors = log_errors(Path(info.log))
    text = f"{headline}\ncommand: {quote(info.command)}\nlog: {info.log}\n"
    if errors:
        text += f"--- errors in the log ---\n{errors}\n"
    return ToolError(text + f"--- last lines of the log ---\n{tail(Path(info.log), 15)}")


VLLM = "vllm"  # the frontend vLLM's records carry (trtkv.backends' OpenAIServer.name; tests start a stand-in)
READY_PATHS = {"tritonserver": "/v2/health/ready"}
OPENAI_READY_PATH = "/health"  # every OpenAI-compatible server trtkv runs (vLLM, trtllm-serve) answers here


def ready_path(name: str) -> str:
    """The readiness endpoint of a frontend."""
    return READY_PATHS.get(name, OPENAI_READY_PATH)


def frontend(info: ServerRecord) -> str:
    """Which server the record is about: tritonserver, or trtllm-serve (OpenAI-compatible, `--trtllm-serve`)."""
    return str(info.extra.get("frontend") or "tritonserver")


def wait_ready(info: ServerRecord, proc: subprocess.Popen[bytes], timeout_s: float) -> float:
    """Seconds until the readiness endpoint answers 200; ToolError with the log tail when the server dies or times
    out."""
    name = frontend(info)
    seconds = wait_http_ready(f"{info.http_url}{ready_path(name)}", lambda: proc.poll() is None, timeout_s)
    if seconds is not None:
        return seconds
    code = proc.poll()
    if code is not None:
        raise _failure(f"{name} exited with code {code} while starting.", info)
    raise _failure(f"{name} was not ready after {timeout_s:.0f} s (recipe triton.startup_timeout_s).", info)


# ---------------------------------------------------------------------------------------------
# serve / stop


def start(recipe: Recipe, *, dry_run: bool = False, timeout_s: float | None = None,
          log: Callable[[str], None] = print, trtllm_serve: bool = False) -> ServerRecord | None:
    """Start the recipe's server and wait until it is ready (None for --dry-run). `trtllm_serve`: TensorRT-LLM's
    OpenAI-compatible server instead of Triton (backend llmapi, GPU)."""
    repo = repo_dir(recipe)
    if trtllm_serve:
        return _start_trtllm_serve(recipe, dry_run=dry_run, timeout_s=timeout_s, log=log)
    if for_recipe(recipe).repo is None:  # no Triton repository: the backend's own OpenAI server (vLLM)
        return _start_openai_server(recipe, dry_run=dry_run, timeout_s=timeout_s, log=log)
    if for_recipe(recipe).serving.serves_locally(recipe):
        return _start_local(recipe, repo, dry_run=dry_run, timeout_s=timeout_s, log=log)
    return _start_gpu(recipe, repo, dry_run=dry_run, timeout_s=timeout_s, log=log)


def _start_local(recipe: Recipe, repo: Path, *, dry_run: bool, timeout_s: float | None,
                 log: Callable[[str], None]) -> ServerRecord | None:
    if dry_run:
        cmd = local_command(recipe, repo, serve_dir(recipe) / "backends")
        log(f"PATH={Path(sys.executable).parent}:$PATH LD_LIBRARY_PATH={python_libdir()} {quote(cmd)}")
        return None
    require_input(repo, "serve", "repo", recipe)
    require_input(engine_dir(recipe), "serve", "build", recipe)
    require_made_from(repo, engine_dir(recipe), "serve", "repo", recipe)
    check_free(recipe, log)
    backends = prepare_backends(recipe)
    cmd = local_command(recipe, repo, backends)
    return _launch(recipe, cmd, repo, server_env(), timeout_s, log)


def _start_gpu(recipe: Recipe, repo: Path, *, dry_run: bool, timeout_s: float | None,
               log: Callable[[str], None]) -> ServerRecord | None:
    inside = Path(CONTAINER_TRITONSERVER).is_file()
    if dry_run:
        log(f"# on a host with Docker and {recipe.hardware.count} GPU(s):\n{shell_block(docker_command(recipe, repo))}")
        box = container_artifacts(recipe).repo  # the configs name the canonical container paths
        log(f"# inside the container:\n{shell_block(gpu_command(recipe, box))}")
        log(f"# equivalent, with the backend's script:\n{quote(launch_script_command(recipe, box))}")
        return None
    require_input(repo, "serve", "repo", recipe)
    for_recipe(recipe).serving.require_input(recipe)
    require_made_from(repo, engine_dir(recipe), "serve", "repo", recipe)
    check_free(recipe, log)
    container = None
    if inside:
        cmd = gpu_command(recipe, inside_repo(recipe, repo))
    elif shutil.which("docker"):
        cmd = docker_command(recipe, repo)
        container = container_name(recipe)
        done, note = stop_container(container, timeout_s=10)  # a leftover of an earlier run would block --name
        if not done:
            log(f"serve: {note}")
    else:
        raise StageError(f"backend {recipe.build.backend.value} needs GPUs and the Triton TensorRT-LLM container, and "
                         f"neither docker nor {CONTAINER_TRITONSERVER} is here. Next: run on the GPU host, or print "
                         f"the commands with `trtkv serve {recipe.name} --dry-run`.")
    return _launch(recipe, cmd, repo, dict(os.environ), timeout_s, log, container=container)


def _start_trtllm_serve(recipe: Recipe, *, dry_run: bool, timeout_s: float | None,
                        log: Callable[[str], None]) -> ServerRecord | None:
    if for_recipe(recipe).serving.serves_locally(recipe):
        raise StageError(f"--trtllm-serve needs TensorRT-LLM and a GPU; {recipe.name} runs on the CPU, where the Triton "
                         f"llmapi model serves it: `trtkv serve {recipe.name}`.")
    server = trtllm_serve_server(recipe)
    inside = shutil.which(server.name) is not None
    if dry_run:
        log(f"# on a host with Docker and {recipe.hardware.count} GPU(s):\n"
            f"{shell_block(trtllm_serve_docker_command(recipe))}")
        log(f"# inside the container:\n{quote(trtllm_serve_command(recipe))}")
        return None
    for_recipe(recipe).serving.require_input(recipe)
    require_input(engine_dir(recipe), "serve", "build", recipe)
    check_free(recipe, log)
    container, at = None, container_artifacts(recipe)
    if inside:  # trtllm-serve installed here: this machine's folders
        cmd, at = trtllm_serve_command(recipe, at=host_artifacts(recipe)), host_artifacts(recipe)
    elif shutil.which("docker"):
        cmd = trtllm_serve_docker_command(recipe)
        container = container_name(recipe)
        stop_container(container, timeout_s=10)
    else:
        raise StageError(f"trtllm-serve is not on PATH and docker is not here. Next: run on the GPU host, or print the "
                         f"commands with `trtkv serve {recipe.name} --trtllm-serve --dry-run`.")
    return _launch(recipe, cmd, repo_dir(recipe), dict(os.environ), timeout_s, log, container=container,
                   name=server.name, served_model=server.served_model(recipe, at))


def _start_openai_server(recipe: Recipe, *, dry_run: bool, timeout_s: float | None,
                         log: Callable[[str], None]) -> ServerRecord | None:
    serving = for_recipe(recipe).serving
    server = serving.openai
    if server is None:  # pragma: no cover - a backend with neither a Triton repository nor a server of its own
        raise StageError(f"backend {recipe.build.backend.value} has no Triton repository and no server of its own")
    problem = server.problem(recipe)
    if dry_run:
        cmd, env = server.here(recipe, check=False)
        if serving.serves_locally(recipe):
            env_text = " ".join(f"{k}={v}" for k, v in env.items())
            log(f"{env_text} {quote(cmd)}" + (f"\n# will be refused here: {problem}" if problem else ""))
        else:
            log(f"# on a host with Docker and {recipe.hardware.count} GPU(s):\n{shell_block(cmd)}")
        return None
    if problem:
        raise StageError(problem)
    serving.require_input(recipe)
    require_input(engine_dir(recipe), "serve", "build", recipe)
    check_free(recipe, log)
    cmd, extra_env = server.here(recipe)
    container = None
    if cmd[0] == "docker":
        if not shutil.which("docker"):
            raise StageError(f"backend {recipe.build.backend.value} on {recipe.hardware.gpu.value} runs in docker, "
                             f"which is not here. Next: run on the GPU host, or print the command with `trtkv serve "
                             f"{recipe.name} --dry-run`.")
        container = container_name(recipe)
        stop_container(container, timeout_s=10)
    return _launch(recipe, cmd, checkpoint_dir(recipe) / HF, {**os.environ, **extra_env}, timeout_s, log,
                   container=container, name=server.name, served_model=server.served_model(recipe))


def _launch(recipe: Recipe, cmd: list[str], repo: Path, env: dict[str, str], timeout_s: float | None,
            log: Callable[[str], None], container: str | None = None, name: str = "tritonserver",
            served_model: str | None = None) -> ServerRecord:
    out = serve_dir(recipe)
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / f"{name}.log"
    t = recipe.triton
    marker = sessions.new_marker()  # every process of this server carries it, also one that calls setsid
    env = {**env, sessions.MARKER_ENV: marker}
    cidfile = None
    if container and cmd[:2] == ["docker", "run"]:
        cidfile = str(out / CIDFILE)
        Path(cidfile).unlink(missing_ok=True)  # docker run refuses to overwrite it
        cmd = with_cidfile(cmd, Path(cidfile))
    with log_path.open("wb") as log_file:
        log_file.write(f"$ {quote(cmd)}\n".encode())
        log_file.flush()
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                cwd=out, start_new_session=True)
    info = ServerRecord(pid=proc.pid, host=t.host, http_port=t.http_port, grpc_port=t.grpc_port,
                      metrics_port=t.metrics_port, command=cmd, log=str(log_path), model_repository=str(repo),
                      started_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"), recipe=recipe.name,
                      backend=recipe.build.backend.value, container=container, cidfile=cidfile,
                      session_id=proc.pid, session_start=sessions.start_time(proc.pid), session_marker=marker,
                      extra={"frontend": name, "served_model_name": served_model} if name != "tritonserver" else {})
    write_server(recipe, info)
    log(f"serve: started {name} (pid {proc.pid}), waiting up to {timeout_s or t.startup_timeout_s:.0f} s for "
        f"{info.http_url}{ready_path(name)}; log {log_path}")
    try:
        info.ready_seconds = round(wait_ready(info, proc, timeout_s or t.startup_timeout_s), 2)
    except BaseException:  # failed, timed out or interrupted half-way: nothing of this start stays behind
        ended = end_server(info, STOP_GRACE_S, lambda m: log(m.replace("stop:", "serve:", 1)), out)
        proc.poll()
        if ended.done:  # else the record stays, so `trtkv stop` finds what is left
            server_json(recipe).unlink(missing_ok=True)
        else:
            log(f"serve: {refusal(info, ended, server_json(recipe))}")
        raise
    write_server(recipe, info)
    write_serve_manifest(recipe, info)
    ports = (f"HTTP {info.http_url}, gRPC {t.host}:{t.grpc_port}, metrics http://{t.host}:{t.metrics_port}/metrics"
             if name == "tritonserver" else f"OpenAI API {info.http_url}/v1 (model {served_model}), metrics "
                                           f"{info.http_url}/metrics")
    log(f"serve: {recipe.name} ready in {info.ready_seconds:.1f} s: {ports} (stop: trtkv stop {recipe.name})")
    return info

