"""The GPU side of a served engine: the Triton TensorRT-LLM container, one tritonserver per rank
under mpirun, the image from the version matrix (trtkv.platform.versions) matching the engine's
recorded TensorRT-LLM.

`trtkv serve` runs these commands (its container id and stop: trtkv.serving.container), `trtkv repo`
prints them in the repository README and `trtkv deploy` puts them in its pods: below the stages.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from trtkv.backends import OpenAIServer, TokenizerSource, for_recipe
from trtkv.contracts.artifacts import Manifest
from trtkv.contracts.canary import canary_script, docker_health_args
from trtkv.contracts.interface import ModelInterface
from trtkv.core.errors import StageError
from trtkv.core.tools import quote
from trtkv.platform import versions
from trtkv.recipe import Recipe
from trtkv.recipe.layout import (
    Artifacts,
    container_artifacts,
    container_mounts,
    engine_dir,
    host_artifacts,
    served_artifacts,
    to_container,
)

IMAGE_ENV = versions.IMAGE_ENV
CONTAINER_TRITONSERVER = "/opt/tritonserver/bin/tritonserver"
# inside the container: docker's -p publishes only on the recipe's triton.host
CONTAINER_BIND = "0.0.0.0"
# /dev/shm for the Python backend's shared-memory regions and NCCL (docker --shm-size, the pods')
TRITON_SHM_GIB = 2


def container_name(recipe: Recipe) -> str:
    """The docker container's name: one per recipe, so a leftover one is found by name."""
    return f"trtkv-{recipe.name}"


def rank_command(
    recipe: Recipe,
    repo: Path,
    rank: int,
    tritonserver: str = CONTAINER_TRITONSERVER,
    host: str | None = None,
) -> list[str]:
    """One rank's tritonserver, as the TensorRT-LLM backend's launch_triton_server.py builds it,
    bound to `host` (default: the recipe's triton.host)."""
    t = recipe.triton
    bind = host or t.host
    cmd = [
        tritonserver,
        f"--model-repository={repo}",
        f"--http-address={bind}",
        f"--http-port={t.http_port}",
        f"--grpc-address={bind}",
        f"--grpc-port={t.grpc_port}",
        f"--metrics-address={bind}",
        f"--metrics-port={t.metrics_port}",
        "--disable-auto-complete-config",
        f"--backend-config=python,shm-region-prefix-name=prefix{rank}_",
    ]
    if rank:
        cmd += ["--model-control-mode=explicit", "--load-model=tensorrt_llm"]
    return cmd


def gpu_command(recipe: Recipe, repo: Path, host: str | None = None) -> list[str]:
    """Inside the container: tritonserver, or `mpirun -n 1 <rank 0> : -n 1 <rank 1> ...` for world
    size > 1.

    The `llmapi` backend runs one tritonserver whatever the world size: the LLM API starts its own
    workers. `host`: the address the servers bind (default the recipe's triton.host; docker_command
    passes 0.0.0.0).
    """
    ranks = for_recipe(recipe).serving.ranks(recipe)
    if ranks == 1:
        return rank_command(recipe, repo, 0, host=host)
    cmd = ["mpirun", "--allow-run-as-root"]
    for rank in range(ranks):
        cmd += ["-n", "1", *rank_command(recipe, repo, rank, host=host)]
        if rank != ranks - 1:
            cmd.append(":")
    return cmd


def launch_script_command(recipe: Recipe, repo: Path) -> list[str]:
    """The same launch through the backend's own script (its path depends on the container
    release)."""
    t = recipe.triton
    ranks = for_recipe(recipe).serving.ranks(recipe)
    return [
        "python3",
        "/app/scripts/launch_triton_server.py",
        f"--world_size={ranks}",
        f"--model_repo={repo}",
        f"--http_port={t.http_port}",
        f"--grpc_port={t.grpc_port}",
        f"--metrics_port={t.metrics_port}",
    ]


def built_versions(recipe: Recipe) -> dict[str, Any]:
    """The TensorRT-LLM/TensorRT versions the engine manifest records (empty when not built here, or
    no engine)."""
    if not for_recipe(recipe).serving.records_versions:
        return {}
    try:
        manifest = Manifest.load(engine_dir(recipe))
    # an unreadable engine manifest records no versions (the build reruns on the next `trtkv build`)
    except StageError:
        return {}
    return dict((manifest.model_extra or {}).get("versions") or {}) if manifest else {}


def container_image(recipe: Recipe) -> str:
    """The image that runs this recipe's engine; StageError when the engine, the recipe and the
    image disagree."""
    built = built_versions(recipe)
    wanted = recipe.build.tensorrt_llm_version
    if built.get("tensorrt_llm") and versions.release(built["tensorrt_llm"]) != versions.release(
        wanted
    ):
        raise StageError(
            f"{engine_dir(recipe)} was built by TensorRT-LLM {built['tensorrt_llm']}, but the "
            f"recipe's build.tensorrt_llm_version is {wanted}: an engine loads only under the "
            f"TensorRT-LLM that built it. Next: rebuild (`trtkv build {recipe.name} --force`) or "
            f"set build.tensorrt_llm_version={versions.release(built['tensorrt_llm'])}."
        )
    image = versions.image_for(built.get("tensorrt_llm") or wanted)
    problems = versions.check_engine_versions(built, image)
    if problems:
        raise StageError(
            f"{image} cannot run {engine_dir(recipe)}: {'; '.join(problems)}. Next: use "
            f"{versions.row_for_trtllm(built['tensorrt_llm']).image}, or rebuild the engine."
        )
    return image


def triton_reads(recipe: Recipe) -> list[Path]:
    """The host folders tritonserver reads: the layout's input (engine or HF export), the calibrated
    tokenizer unless the served model carries it, and the repository."""
    layout = for_recipe(recipe).repo
    if layout is None:
        return []
    needed, _stage = layout.input(recipe)
    host = host_artifacts(recipe)
    reads = (
        [needed] if layout.tokenizer is TokenizerSource.SERVED_MODEL else [needed, host.tokenizer]
    )
    return [*reads, host.repo]


def volume_args(recipe: Recipe, folders: list[Path]) -> list[str]:
    """`-v HOST:CONTAINER:ro` for each host folder, at its canonical container path
    (/models/<recipe>/...): the server only reads them."""
    return [
        a for host, box in container_mounts(recipe, folders) for a in ("-v", f"{host}:{box}:ro")
    ]


def docker_command(recipe: Recipe, repo: Path) -> list[str]:
    """docker run of the Triton TensorRT-LLM image; the folders it reads (`repo` and the engine or
    HF export, on this host) mounted at their canonical container paths, which the repository's
    configs name.

    Ports are published on the recipe's triton.host only; inside the container the servers bind
    0.0.0.0 (docker forwards to the container's own interface, which a 127.0.0.1 bind would not
    answer).
    """
    t = recipe.triton
    cmd = _docker_run(recipe, TRITON_SHM_GIB)
    for port in (t.http_port, t.grpc_port, t.metrics_port):
        cmd += ["-p", f"{t.host}:{port}:{port}"]
    # docker's health check is the real one-token inference (Triton answers "ready" with a dead
    # model instance)
    cmd += docker_health_args(canary_script(t.http_port, _interface(recipe)), t.startup_timeout_s)
    box = container_artifacts(recipe)
    reads = [f for f in triton_reads(recipe) if f != host_artifacts(recipe).repo]
    cmd += [*volume_args(recipe, reads), "-v", f"{repo}:{box.repo}:ro", container_image(recipe)]
    return cmd + gpu_command(recipe, box.repo, host=CONTAINER_BIND)


def _docker_run(recipe: Recipe, shm_gib: int) -> list[str]:
    """The head of `docker run` of the Triton TensorRT-LLM image: removed on exit, every GPU, its
    /dev/shm, the image's recommended ulimits, named trtkv-<recipe>."""
    ulimits = ["--ulimit", "memlock=-1", "--ulimit", "stack=67108864"]
    head = ["docker", "run", "--rm", "--gpus", "all", f"--shm-size={shm_gib}g", *ulimits]
    return [*head, "--name", container_name(recipe)]


def _interface(recipe: Recipe) -> ModelInterface:
    repo = for_recipe(recipe).repo
    if repo is None:
        raise StageError(
            f"{recipe.name}: backend {recipe.build.backend.value} has no Triton repository: "
            f"tritonserver does not serve it. Next: `trtkv serve {recipe.name}` runs its own "
            "server."
        )
    return repo.interface


def inside_repo(recipe: Recipe, repo: Path) -> Path:
    """The repository tritonserver loads when trtkv runs inside the Triton container: its configs
    name the canonical container paths (/models/<recipe>/...), so those must be where the artifacts
    are mounted."""
    at, layout = container_artifacts(recipe), for_recipe(recipe).repo
    needed = [at.repo] + (
        [to_container(recipe, layout.input(recipe)[0])] if layout is not None else []
    )
    missing = [p for p in needed if not p.exists()]
    if missing:
        raise StageError(
            f"serve {recipe.name}: inside the container, the repository's configs name the "
            f"canonical paths under {at.root}, and {missing[0]} is not there. Next: start the "
            f"container with the mounts `trtkv serve {recipe.name} --dry-run` prints (-v "
            f"{repo}:{at.repo}:ro ...), or run `trtkv serve {recipe.name}` on the host, which "
            "starts docker with them."
        )
    return at.repo


def trtllm_serve_server(recipe: Recipe) -> OpenAIServer:
    """The OpenAI-compatible alternative to a Triton-served backend (`--trtllm-serve`:
    TensorRT-LLM's, backend llmapi); StageError for a backend that has none."""
    backend = for_recipe(recipe)
    if backend.repo is None or backend.serving.openai is None:
        raise StageError(
            f"--trtllm-serve serves the LLM API path; {recipe.name} has build.backend "
            f"{recipe.build.backend.value}. Next: use a recipe with build.backend llmapi (e.g. "
            f"llama70b_fp8kv_llmapi), or serve this one with Triton (`trtkv serve {recipe.name}`)."
        )
    return backend.serving.openai


def trtllm_serve_command(
    recipe: Recipe, host: str | None = None, at: Artifacts | None = None
) -> list[str]:
    """TensorRT-LLM's OpenAI-compatible server on the recipe's HF export (backend llmapi), with the
    build's --config; `at`: where the artifacts are (default: the canonical container paths of a GPU
    recipe)."""
    return trtllm_serve_server(recipe).command(
        recipe, host or recipe.triton.host, at or served_artifacts(recipe)
    )


def trtllm_serve_docker_command(recipe: Recipe) -> list[str]:
    """docker run of the TensorRT-LLM image running trtllm-serve; the HTTP port published on
    triton.host only, the HF export and the build folder mounted at their canonical container
    paths."""
    t = recipe.triton
    server = trtllm_serve_server(recipe)
    model = server.served_model(recipe)
    cmd = [
        *_docker_run(recipe, server.shm_gib),
        "-p",
        f"{t.host}:{t.http_port}:{t.http_port}",
        *docker_health_args(canary_script(t.http_port, openai_model=model), t.startup_timeout_s),
        *volume_args(recipe, server.reads(recipe)),
        container_image(recipe),
    ]
    return cmd + trtllm_serve_command(recipe, host=CONTAINER_BIND, at=container_artifacts(recipe))


BREAK_BEFORE = ("-p", "-v", "mpirun", ":", "--name")


def shell_block(cmd: list[str]) -> str:
    """A long command on several lines (each mount, port, rank and the image on its own line)."""
    lines = [quote(cmd[:1])]
    for token in cmd[1:]:
        if (
            token in BREAK_BEFORE
            or token.startswith("nvcr.io/")
            or token == os.environ.get(IMAGE_ENV)
        ):
            lines.append(quote([token]))
        else:
            lines[-1] += " " + quote([token])
    return " \\\n    ".join(lines)
