"""Start and stop Triton for a recipe.

CPU (backend `reference`): the `tritonserver` binary bundled in the `nvidia-pytriton` wheel, with a
Python-backend folder built under engines/<recipe>/serve/backends, the venv's bin first on PATH (the
backend stub finds its interpreter through `python3`) and LD_LIBRARY_PATH set to the venv
interpreter's own LIBDIR (so the stub loads the libpython this Python was built with). GPU backends
served by Triton (`tensorrt`, `llmapi`): the NVIDIA Triton TensorRT-LLM container, one tritonserver
per rank under `mpirun` when tp x pp > 1 (what the backend's launch_triton_server.py runs). `vllm`
and `sglang` start their own OpenAI server (the backend's serving part); the Triton image is the
version matrix's for the TensorRT-LLM the engine was built with (trtkv.platform.versions). The
server runs in its own session, so `trtkv serve` returns; `trtkv stop` (and a failed or interrupted
start, and every supervisor restart) ends that whole session and waits until its GPU memory is free
(trtkv.serving.teardown); a container is named `trtkv-<recipe>` and stopped only when proven this
checkout's (trtkv.serving.owner). The bundled tritonserver's backend folder, environment and command
are trtkv.backends.bundled; running the chosen command, its record (server.json) and the wait for
readiness, trtkv.serving.launch.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from trtkv.backends import (
    CONTAINER_TRITONSERVER,
    container_name,
    docker_command,
    for_recipe,
    gpu_command,
    inside_repo,
    launch_script_command,
    local_command,
    prepare_backends,
    python_libdir,
    server_env,
    shell_block,
    trtllm_serve_command,
    trtllm_serve_docker_command,
    trtllm_serve_server,
)
from trtkv.contracts.artifacts import ServerRecord
from trtkv.contracts.stage import require_input, require_made_from
from trtkv.core.errors import StageError
from trtkv.core.process import port_in_use
from trtkv.core.tools import quote
from trtkv.recipe import Recipe
from trtkv.recipe.layout import (
    HF,
    checkpoint_dir,
    container_artifacts,
    engine_dir,
    host_artifacts,
    repo_dir,
    serve_dir,
)
from trtkv.serving.launch import server_json, start_server
from trtkv.serving.owner import clear_leftover
from trtkv.serving.teardown import STOP_GRACE_S, refusal, running, stop_server
from trtkv.serving.teardown import stop as stop  # `trtkv stop` and the chain call serve.stop

# ---------------------------------------------------------------------------------------------
# Before a start: the record, the free ports


def read_server(recipe: Recipe) -> ServerRecord | None:
    """The recorded server (None when there is none); StageError when server.json is unreadable."""
    return ServerRecord.load(serve_dir(recipe))


def check_free(recipe: Recipe, log: Callable[[str], None] = print) -> None:
    """Refuse when a server for the recipe is recorded and alive, or one of its ports is taken; the
    leftovers of a recorded server that died (its session's other processes) are ended first."""
    info = read_server(recipe)
    if info is not None:
        if running(info):
            raise StageError(
                f"a server for recipe {recipe.name} is already running (pid {info.pid}, "
                f"{info.http_url}, log {info.log}). Next: use it, or `trtkv stop {recipe.name}` "
                "first."
            )
        left = stop_server(recipe, timeout_s=STOP_GRACE_S, log=log)
        if left is not None and not left.done:
            raise StageError(
                f"the last server for {recipe.name} (pid {info.pid}): "
                f"{refusal(info, left, server_json(recipe))}"
            )
    t = recipe.triton
    for field_name, port in (
        ("http_port", t.http_port),
        ("grpc_port", t.grpc_port),
        ("metrics_port", t.metrics_port),
    ):
        if port_in_use(t.host, port):
            raise StageError(
                f"port {port} (recipe triton.{field_name}) on {t.host} is already in use by "
                f"another program. Next: stop it, or pick a free port: `trtkv serve {recipe.name} "
                f"triton.{field_name}=<port>`."
            )


# ---------------------------------------------------------------------------------------------
# serve / stop


def start(
    recipe: Recipe,
    *,
    dry_run: bool = False,
    timeout_s: float | None = None,
    log: Callable[[str], None] = print,
    trtllm_serve: bool = False,
) -> ServerRecord | None:
    """Start the recipe's server and wait until it is ready (None for --dry-run). `trtllm_serve`:
    TensorRT-LLM's OpenAI-compatible server instead of Triton (backend llmapi, GPU)."""
    repo = repo_dir(recipe)
    if not dry_run:
        say_kv_scales(recipe, log)
    if trtllm_serve:
        return _start_trtllm_serve(recipe, dry_run=dry_run, timeout_s=timeout_s, log=log)
    # no Triton repository: the backend's own OpenAI server (vLLM)
    if for_recipe(recipe).repo is None:
        return _start_openai_server(recipe, dry_run=dry_run, timeout_s=timeout_s, log=log)
    if for_recipe(recipe).serving.serves_locally(recipe):
        return _start_local(recipe, repo, dry_run=dry_run, timeout_s=timeout_s, log=log)
    return _start_gpu(recipe, repo, dry_run=dry_run, timeout_s=timeout_s, log=log)


def say_kv_scales(recipe: Recipe, log: Callable[[str], None]) -> None:
    """Before the engine starts: the KV scales it will use per layer (`trtkv scales`' audit)."""
    from trtkv.engines.kv_scale_text import serve_scale_lines

    folder = checkpoint_dir(recipe)
    if recipe.kv_row.choice.kind != "unquantized" and folder.is_dir():
        for line in serve_scale_lines(folder, recipe.build.backend.value, recipe.name):
            log(line)


def _start_local(
    recipe: Recipe,
    repo: Path,
    *,
    dry_run: bool,
    timeout_s: float | None,
    log: Callable[[str], None],
) -> ServerRecord | None:
    if dry_run:
        cmd = local_command(recipe, repo, serve_dir(recipe) / "backends")
        log(
            f"PATH={quote([str(Path(sys.executable).parent)])}:$PATH "
            f"LD_LIBRARY_PATH={quote([str(python_libdir())])} "
            f"{quote(cmd)}"
        )
        return None
    require_input(repo, "serve", "repo", recipe)
    require_input(engine_dir(recipe), "serve", "build", recipe)
    require_made_from(repo, engine_dir(recipe), "serve", "repo", recipe)
    check_free(recipe, log)
    backends = prepare_backends(recipe)
    cmd = local_command(recipe, repo, backends)
    return start_server(recipe, cmd, repo, server_env(), timeout_s, log)


def _start_gpu(
    recipe: Recipe,
    repo: Path,
    *,
    dry_run: bool,
    timeout_s: float | None,
    log: Callable[[str], None],
) -> ServerRecord | None:
    inside = Path(CONTAINER_TRITONSERVER).is_file()
    if dry_run:
        log(
            f"# on a host with Docker and {recipe.hardware.count} "
            f"GPU(s):\n{shell_block(docker_command(recipe, repo))}"
        )
        box = container_artifacts(recipe).repo  # the configs name the canonical container paths
        log(f"# inside the container:\n{shell_block(gpu_command(recipe, box))}")
        log(
            f"# equivalent, with the backend's script:\n{quote(launch_script_command(recipe, box))}"
        )
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
        # a leftover of this checkout's earlier run would block --name; another's is refused
        clear_leftover(container, serve_dir(recipe), log)
    else:
        raise StageError(
            f"backend {recipe.build.backend.value} needs GPUs and the Triton TensorRT-LLM "
            f"container, and neither docker nor {CONTAINER_TRITONSERVER} is here. Next: run on the "
            f"GPU host, or print the commands with `trtkv serve {recipe.name} --dry-run`."
        )
    return start_server(recipe, cmd, repo, dict(os.environ), timeout_s, log, container=container)


def _start_trtllm_serve(
    recipe: Recipe, *, dry_run: bool, timeout_s: float | None, log: Callable[[str], None]
) -> ServerRecord | None:
    if for_recipe(recipe).serving.serves_locally(recipe):
        raise StageError(
            f"--trtllm-serve needs TensorRT-LLM and a GPU; {recipe.name} runs on the CPU, where "
            f"the Triton llmapi model serves it: `trtkv serve {recipe.name}`."
        )
    server = trtllm_serve_server(recipe)
    inside = shutil.which(server.name) is not None
    if dry_run:
        log(
            f"# on a host with Docker and {recipe.hardware.count} GPU(s):\n"
            f"{shell_block(trtllm_serve_docker_command(recipe))}"
        )
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
        clear_leftover(container, serve_dir(recipe), log)
    else:
        raise StageError(
            "trtllm-serve is not on PATH and docker is not here. Next: run on the GPU host, or "
            f"print the commands with `trtkv serve {recipe.name} --trtllm-serve --dry-run`."
        )
    return start_server(
        recipe,
        cmd,
        repo_dir(recipe),
        dict(os.environ),
        timeout_s,
        log,
        container=container,
        name=server.name,
        served_model=server.served_model(recipe, at),
    )


def _start_openai_server(
    recipe: Recipe, *, dry_run: bool, timeout_s: float | None, log: Callable[[str], None]
) -> ServerRecord | None:
    serving = for_recipe(recipe).serving
    server = serving.openai
    if server is None:  # pragma: no cover - a backend with neither a Triton repository nor a server
        raise StageError(
            f"backend {recipe.build.backend.value} has no Triton repository and no server of its "
            "own"
        )
    problem = server.problem(recipe)
    if dry_run:
        cmd, env = server.here(recipe, check=False)
        if serving.serves_locally(recipe):
            env_text = " ".join(f"{k}={quote([v])}" for k, v in env.items())
            log(
                f"{env_text} {quote(cmd)}"
                + (f"\n# will be refused here: {problem}" if problem else "")
            )
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
            raise StageError(
                f"backend {recipe.build.backend.value} on {recipe.hardware.gpu.value} runs in "
                "docker, which is not here. Next: run on the GPU host, or print the command with "
                f"`trtkv serve {recipe.name} --dry-run`."
            )
        container = container_name(recipe)
        clear_leftover(container, serve_dir(recipe), log)
    return start_server(
        recipe,
        cmd,
        checkpoint_dir(recipe) / HF,
        {**os.environ, **extra_env},
        timeout_s,
        log,
        container=container,
        name=server.name,
        served_model=server.served_model(recipe),
    )
