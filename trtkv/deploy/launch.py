"""What runs in the pods or Slurm tasks of a deployment, per backend: the image, the server command on one node, the
multi-node launch (leader and workers), the ports, the health check (the same one-token canary as the container's
--health-cmd, trtkv.contracts.canary) and the folders the server reads.

- tensorrt (engine path): tritonserver, one per rank under mpirun (the Triton TensorRT-LLM backend's own launch).
- llmapi: on one node the Triton `llmapi` model (TP inside the LLM API, one tritonserver); across nodes
  `trtllm-llmapi-launch trtllm-serve` under mpirun / srun (TensorRT-LLM's multi-node path; the Triton model has none).
- vllm: vLLM's OpenAI server; across nodes a Ray cluster (head on the leader, `--distributed-executor-backend ray`).

Multi-node MPI over Kubernetes pods uses ssh on port 2222 with a key from a Secret (the pods run sshd); Slurm uses
srun's PMIx instead. Nothing here was executed on a cluster.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

from trtkv.contracts.canary import canary_script
from trtkv.contracts.interface import for_layout
from trtkv.core import paths
from trtkv.core.apikey import API_KEY_ENV, TRITON_KEY_HEADER, VLLM_KEY_ENV
from trtkv.deploy.sizing import Sizing
from trtkv.recipe import Recipe
from trtkv.recipe.layout import checkpoint_dir, engine_dir, repo_dir
from trtkv.serving.container import (
    CONTAINER_BIND,
    CONTAINER_TRITONSERVER,
    container_image,
    gpu_command,
    rank_command,
    trtllm_serve_command,
)

SSH_PORT = 2222
SSH_DIR = "/etc/trtkv-ssh"  # the Secret with id_ed25519 and authorized_keys
RAY_PORT = 6379
SSH_WAIT_S = 600  # how long a leader waits for the other pods' sshd (or Ray nodes) before it gives up
# Triton's APIs that change the server (load/unload models, register shared memory, trace and log settings): keyed
RESTRICTED_APIS = "shared-memory,model-repository,trace,logging"
KEY_REF = "\x00" + API_KEY_ENV + "\x00"  # in a command token: the key, expanded by the shell that runs the command
REQUIRE_KEY = (f'[ -n "${{{API_KEY_ENV}:-}}" ] || {{ echo "trtkv: {API_KEY_ENV} is empty: the server would run '
               f'without its API key" >&2; exit 1; }}; ')


def restricted_args() -> list[str]:
    """tritonserver flags keying the APIs that change the server (RESTRICTED_APIS) on HTTP and gRPC: a request needs
    the header trtkv-api-key: <key>; inference, health, metadata and the model configs stay open to the clients the
    network admits."""
    return [f"--http-restricted-api={RESTRICTED_APIS}:{TRITON_KEY_HEADER}={KEY_REF}",
            f"--grpc-restricted-protocol={RESTRICTED_APIS}:{TRITON_KEY_HEADER}={KEY_REF}"]


def with_restricted(cmd: list[str]) -> list[str]:
    """`cmd` with restricted_args() after every tritonserver (each rank of an mpirun line)."""
    out: list[str] = []
    for token in cmd:
        out.append(token)
        if token == CONTAINER_TRITONSERVER:
            out += restricted_args()
    return out


def shell_join(cmd: list[str], raw: dict[str, str] | None = None) -> str:
    """A command as one shell line: every token quoted (shlex), KEY_REF as "$TRTKV_API_KEY" and the tokens of `raw`
    as the shell text given (e.g. "$HOSTS"), token by token, so no value can reach the shell unquoted."""
    parts = []
    for token in cmd:
        if raw and token in raw:
            parts.append(raw[token])
        elif KEY_REF in token:
            head, _, tail = token.partition(KEY_REF)
            parts.append(shlex.quote(head) + f'"${API_KEY_ENV}"' + (shlex.quote(tail) if tail else ""))
        else:
            parts.append(shlex.quote(token))
    return " ".join(parts)


@dataclass
class Launch:
    server: str  # "triton", "trtllm-serve" or "vllm"
    image: str
    ports: dict[str, int]  # name -> port (http first)
    metrics_path: str | None  # Prometheus text on ports["metrics"] (or http); None: no Prometheus endpoint
    canary: str  # python3 program: exit 0 only when a one-token inference answers
    mounts: list[tuple[str, str]]  # (folder under the models volume, path in the container)
    single: list[str]  # the command on one node
    multi_node: bool
    leader: list[str] = field(default_factory=list)  # MPI/Ray launch on the first node (multi-node)
    uses_ssh: bool = False  # workers run sshd for mpirun
    ray_worker: bool = False  # workers join a Ray cluster
    keyed: bool = False  # the server checks $TRTKV_API_KEY (Triton: restricted APIs; vLLM: VLLM_API_KEY on /v1)
    non_root: bool = False  # the image runs as any user (vLLM); the NGC Triton/TensorRT-LLM launches need root


def volume_folders(recipe: Recipe, server: str) -> list[tuple[str, str]]:
    """(folder under the models volume, path in the container) of what `server` reads, at the same absolute paths as
    here, because the Triton repository and the serve configs name them. Only these folders are copied and mounted.

    server: "triton" (the repository, the engine or the HF export it names, the tokenizer), "trtllm-serve" (the HF
    export and the build's llm_api_options.yaml), "hf" (the HF export only: vLLM, Dynamo's workers)."""
    from trtkv.backends import for_recipe as backend_for

    root = paths.recipe_output_dir(recipe.name)
    wanted = [checkpoint_dir(recipe) / "hf"]
    if server == "trtllm-serve":
        wanted.append(engine_dir(recipe))
    elif server == "triton":
        layout = backend_for(recipe).repo_layout
        wanted = ([checkpoint_dir(recipe) / "hf"] if layout == "llmapi"
                  else [engine_dir(recipe), checkpoint_dir(recipe) / "tokenizer"])
    out = [(f"engines/{recipe.name}/{p.relative_to(root)}", str(p)) for p in wanted]
    if server == "triton":
        out.append((f"triton_repo/{recipe.name}", str(repo_dir(recipe))))
    return out


def enroot_image(image: str) -> str:
    """pyxis/enroot's image reference: the registry host is separated by '#' (REGISTRY#IMAGE:TAG); a bare name is
    looked up on enroot's default registry."""
    head, _, rest = image.partition("/")
    return f"{head}#{rest}" if rest and ("." in head or ":" in head) else image


def hf_dir(recipe: Recipe) -> Path:
    return checkpoint_dir(recipe) / "hf"


def for_recipe(recipe: Recipe, sizing: Sizing, slurm: bool = False) -> Launch:
    """`slurm`: the LLM API always runs as trtllm-llmapi-launch trtllm-serve there (srun starts one task per rank)."""
    from trtkv.backends import for_recipe as backend_for

    multi = sizing.nodes_per_replica > 1
    layout = backend_for(recipe).repo_layout
    t = recipe.triton
    if layout == "openai":  # vLLM
        from trtkv.backends import vllm

        args = vllm.server_args(recipe, hf_dir(recipe), CONTAINER_BIND)
        single = ["python3", "-m", "vllm.entrypoints.openai.api_server", *args]
        launch = Launch("vllm", vllm.VLLM_IMAGE, {"http": t.http_port}, "/metrics",
                        canary_script(t.http_port, openai_model=vllm.served_model_name(recipe)),
                        volume_folders(recipe, "hf"), single, multi, keyed=True, non_root=True)
        if multi:
            launch.leader = [*single, "--distributed-executor-backend", "ray"]
            launch.ray_worker = True
        return launch
    image = container_image(recipe)
    if layout == "llmapi" and (multi or slurm):
        serve = trtllm_serve_command(recipe, host=CONTAINER_BIND)
        return Launch("trtllm-serve", image, {"http": t.http_port}, None,
                      canary_script(t.http_port, openai_model=str(hf_dir(recipe))),
                      volume_folders(recipe, "trtllm-serve"),
                      ["trtllm-llmapi-launch", *serve], multi,
                      leader=["mpirun", "--allow-run-as-root", "-np", str(sizing.gpus_per_replica),
                              "trtllm-llmapi-launch", *serve], uses_ssh=True)
    interface = for_layout(layout)
    repo = repo_dir(recipe)
    command = with_restricted(gpu_command(recipe, repo, host=CONTAINER_BIND))
    launch = Launch("triton", image, {"http": t.http_port, "grpc": t.grpc_port, "metrics": t.metrics_port},
                    "/metrics", canary_script(t.http_port, interface), volume_folders(recipe, "triton"),
                    command, multi, keyed=True)
    if multi:
        launch.leader, launch.uses_ssh = command, True
    return launch


def slurm_rank_command(recipe: Recipe, launch: Launch) -> str:
    """One Slurm task's command (srun --mpi=pmix starts world-size tasks; PMIx gives each its MPI rank).

    Triton: rank 0 serves HTTP/gRPC/metrics, the others load only tensorrt_llm (launch_triton_server.py's split);
    the LLM API: every task runs trtllm-llmapi-launch, which makes rank 0 the server and the rest its workers.
    """
    if launch.server != "triton":
        key = f'export {VLLM_KEY_ENV}="${API_KEY_ENV}"\n' if launch.server == "vllm" else ""
        return key + "exec " + shell_join(launch.single)
    repo = repo_dir(recipe)
    rank0 = shell_join(with_restricted(rank_command(recipe, repo, 0, host=CONTAINER_BIND)))
    other_cmd = with_restricted(rank_command(recipe, repo, 1, host=CONTAINER_BIND))
    prefix = next(t for t in other_cmd if t.endswith("shm-region-prefix-name=prefix1_"))
    other = shell_join(other_cmd, {prefix: shlex.quote(prefix[:-2]) + '"$SLURM_PROCID"_'})
    return f'if [ "$SLURM_PROCID" = 0 ]; then\n    exec {rank0}\nfi\nexec {other}'
