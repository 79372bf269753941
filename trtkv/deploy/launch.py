"""What runs in the pods or Slurm tasks of a deployment, per backend: the image, the server command
on one node, the multi-node launch (leader and workers), the ports, the engine's own health
endpoints (liveness, startup), the readiness check (the same one-token canary as the container's
--health-cmd, trtkv.contracts.canary), the /dev/shm it needs, the user it runs as and the folders it
reads, as (host folder, canonical container folder under /models/<recipe>).

- tensorrt (engine path): tritonserver, one per rank under mpirun (the Triton TensorRT-LLM backend's
  own launch).
- llmapi: on one node the Triton `llmapi` model (TP inside the LLM API, one tritonserver); across
  nodes `trtllm-llmapi-launch trtllm-serve` under mpirun / srun (TensorRT-LLM's multi-node path; the
  Triton model has none).
- vllm: vLLM's OpenAI server; across nodes a Ray cluster (head on the leader,
  `--distributed-executor-backend ray`).

Multi-node MPI over Kubernetes pods uses ssh on port 2222 with a key from a Secret (every pod runs
sshd as the image's own non-root user); Slurm uses srun's PMIx instead. Nothing here was executed on
a cluster.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

from trtkv.backends import (
    CONTAINER_BIND,
    CONTAINER_TRITONSERVER,
    DP_ADDRESS,
    DP_START,
    TRITON_SHM_GIB,
    OpenAIServer,
    container_image,
    gpu_command,
    rank_command,
    triton_reads,
)
from trtkv.contracts.canary import canary_script
from trtkv.core.apikey import API_KEY_ENV, TRITON_KEY_HEADER
from trtkv.core.errors import StageError
from trtkv.deploy.resources import canary_timeout_s, host_tier_gib_per_pod
from trtkv.deploy.sizing import Sizing
from trtkv.recipe import Recipe
from trtkv.recipe.layout import HF, checkpoint_dir, container_artifacts, container_mounts

SSH_PORT = 2222
SSH_DIR = "/etc/trtkv-ssh"  # the Secret with id_ed25519 and authorized_keys
RAY_PORT = 6379
# how long a leader waits for the other pods' sshd (or Ray nodes) before it gives up
SSH_WAIT_S = 600
# Triton's KServe v2 health endpoints (core's HTTP server): live = the process serves HTTP; ready =
# every model loaded
TRITON_LIVE = "/v2/health/live"
TRITON_READY = "/v2/health/ready"
# The NGC Triton / TensorRT-LLM images' own user: triton-server, uid and gid 1000
# (triton-inference-server/server build.py asserts both "to run triton as non-root"); ssh and
# OpenMPI need a uid with a passwd entry
NGC_UID = 1000
# Images that run as any user (vLLM, SGLang): a high uid of no host account
ANY_UID = 10001
# Triton's APIs that change the server (load/unload models, register shared memory, trace and log
# settings): keyed
RESTRICTED_APIS = "shared-memory,model-repository,trace,logging"
# in a command token: the key, expanded by the shell that runs the command
KEY_REF = "\x00" + API_KEY_ENV + "\x00"
REQUIRE_KEY = (
    f'[ -n "${{{API_KEY_ENV}:-}}" ] || {{ echo "trtkv: {API_KEY_ENV} is empty: the server would '
    'run without its API key" >&2; exit 1; }; '
)


def restricted_args() -> list[str]:
    """tritonserver flags keying the APIs that change the server (RESTRICTED_APIS) on HTTP and gRPC:
    a request needs the header trtkv-api-key: <key>; inference, health, metadata and the model
    configs stay open to the clients the network admits."""
    return [
        f"--http-restricted-api={RESTRICTED_APIS}:{TRITON_KEY_HEADER}={KEY_REF}",
        f"--grpc-restricted-protocol={RESTRICTED_APIS}:{TRITON_KEY_HEADER}={KEY_REF}",
    ]


def with_restricted(cmd: list[str]) -> list[str]:
    """`cmd` with restricted_args() after every tritonserver (each rank of an mpirun line)."""
    out: list[str] = []
    for token in cmd:
        out.append(token)
        if token == CONTAINER_TRITONSERVER:
            out += restricted_args()
    return out


def shell_join(cmd: list[str], raw: dict[str, str] | None = None) -> str:
    """A command as one shell line: every token quoted (shlex), KEY_REF as "$TRTKV_API_KEY" and the
    tokens of `raw` as the shell text given (e.g. "$HOSTS"), token by token, so no value can reach
    the shell unquoted."""
    parts = []
    for token in cmd:
        if raw and token in raw:
            parts.append(raw[token])
        elif KEY_REF in token:
            head, _, tail = token.partition(KEY_REF)
            parts.append(
                (shlex.quote(head) if head else "")
                + f'"${API_KEY_ENV}"'
                + (shlex.quote(tail) if tail else "")
            )
        else:
            parts.append(shlex.quote(token))
    return " ".join(parts)


@dataclass
class Launch:
    server: str  # "triton", or the OpenAI server's name ("trtllm-serve", "vllm")
    image: str
    ports: dict[str, int]  # name -> port (http first)
    # Prometheus text on ports["metrics"] (or http); None: no Prometheus endpoint
    metrics_path: str | None
    canary: str  # python3 program: exit 0 only when a one-token inference answers
    # (folder on this host, its canonical path in the container) the server reads
    folders: list[tuple[Path, Path]]
    single: list[str]  # the command on one node
    multi_node: bool
    leader: list[str] = field(default_factory=list)  # MPI/Ray launch on the first node (multi-node)
    uses_ssh: bool = False  # workers run sshd for mpirun
    # the other nodes' command where the server spreads its attention-DP ranks itself (vLLM's
    # multi-node DP: DP_ADDRESS, DP_START stand for the leader's address and the node's first rank)
    dp_worker: list[str] = field(default_factory=list)
    dp_local: int = 0  # attention-DP ranks per node
    ray_worker: bool = False  # workers join a Ray cluster
    # the server checks $TRTKV_API_KEY (Triton: restricted APIs; vLLM: VLLM_API_KEY on /v1)
    keyed: bool = False
    # the user the containers run as (the NGC images' triton-server; ANY_UID where any user works)
    uid: int = NGC_UID
    triton: bool = False  # tritonserver ranks (rank 0 serves, the others load tensorrt_llm only)
    # Slurm starts one task per node (the server starts its own TP workers; across nodes a Ray
    # cluster), not one per rank
    one_task_per_node: bool = False
    # the variable the server itself reads $TRTKV_API_KEY from (vLLM: VLLM_API_KEY)
    key_env: str | None = None
    key_note: str = ""  # the README's line on what the key guards
    label: str = "Triton"  # the server's name in prose
    live_path: str = TRITON_LIVE  # GET: the engine's own liveness endpoint on ports["http"]
    start_path: str = TRITON_READY  # GET: 200 once it serves (the startup probe)
    shm_gib: int = 2  # the memory-backed /dev/shm it needs
    # the pinned host KV tier one pod holds (GiB; trtkv.deploy.resources.host_tier_gib_per_pod)
    host_tier_gib: float = 0.0


TRITON_KEY_NOTE = (
    f"- Triton's APIs that change the server ({RESTRICTED_APIS}) need the header "
    f"`{TRITON_KEY_HEADER}: <key>` on HTTP and gRPC (`--http-restricted-api`, "
    "`--grpc-restricted-protocol`); inference, health, metadata and model configs stay open to the "
    "clients the network admits."
)


def relative(recipe: Recipe, container_path: Path) -> str:
    """A canonical container folder relative to /models/<recipe> (the loader's source and the
    volume's layout)."""
    return str(container_path.relative_to(container_artifacts(recipe).root))


def enroot_image(image: str) -> str:
    """pyxis/enroot's image reference: the registry host is separated by '#' (REGISTRY#IMAGE:TAG); a
    bare name is looked up on enroot's default registry."""
    head, _, rest = image.partition("/")
    return f"{head}#{rest}" if rest and ("." in head or ":" in head) else image


def hf_dir(recipe: Recipe) -> Path:
    return checkpoint_dir(recipe) / HF


def _openai_launch(recipe: Recipe, sizing: Sizing, server: OpenAIServer) -> Launch:
    """The backend's OpenAI server: alone (vLLM), or for a layout whose Triton model cannot span
    ranks (the LLM API on several nodes or under Slurm: trtllm-llmapi-launch trtllm-serve)."""
    t = recipe.triton
    multi = sizing.nodes_per_replica > 1
    single = server.node_command(recipe, CONTAINER_BIND)
    launch = Launch(
        server.name,
        server.image(recipe) or container_image(recipe),
        {"http": t.http_port},
        server.metrics_path,
        canary_script(
            t.http_port,
            openai_model=server.served_model(recipe),
            timeout_s=float(canary_timeout_s(recipe, sizing)),
        ),
        container_mounts(recipe, server.reads(recipe)),
        single,
        multi,
        # SGLang: --api-key in argv
        keyed=server.key_env is not None or any(KEY_REF in t for t in single),
        uid=ANY_UID if server.non_root else NGC_UID,
        one_task_per_node=not server.rank_tasks,
        key_env=server.key_env,
        key_note=server.key_note,
        label=server.label,
        live_path=server.health_path,
        start_path=server.health_path,
        shm_gib=server.shm_gib,
        host_tier_gib=host_tier_gib_per_pod(recipe, sizing),
    )
    dp = server.data_parallel_nodes(recipe, CONTAINER_BIND, sizing.gpus_per_pod) if multi else None
    if dp is not None:  # every node its own DP ranks, the leader coordinating (no Ray, no ssh)
        launch.leader, launch.dp_worker = dp
        launch.dp_local = recipe.parallelism.groups_per_node(sizing.gpus_per_pod)
    elif not server.ray:  # mpirun over ssh (its leader line is kept whatever the node count)
        launch.leader, launch.uses_ssh = (
            server.leader_command(recipe, CONTAINER_BIND, sizing.gpus_per_replica),
            True,
        )
    elif multi:  # the Ray head on the leader, the workers join it
        launch.leader, launch.ray_worker = (
            server.leader_command(recipe, CONTAINER_BIND, sizing.gpus_per_replica),
            True,
        )
    return launch


def for_recipe(recipe: Recipe, sizing: Sizing, slurm: bool = False) -> Launch:
    """`slurm`: the LLM API always runs as trtllm-llmapi-launch trtllm-serve there (srun starts one
    task per rank)."""
    from trtkv.backends import for_recipe as backend_for

    backend = backend_for(recipe)
    multi = sizing.nodes_per_replica > 1
    server = backend.serving.openai
    if backend.repo is None or (
        server is not None and not backend.serving.rank_processes and (multi or slurm)
    ):
        if server is None:  # pragma: no cover - a backend with no Triton repository and no server
            raise StageError(
                f"deploy {recipe.name}: backend {recipe.build.backend.value} has no server to "
                "deploy"
            )
        return _openai_launch(recipe, sizing, server)
    t = recipe.triton
    command = with_restricted(
        gpu_command(recipe, container_artifacts(recipe).repo, host=CONTAINER_BIND)
    )
    launch = Launch(
        "triton",
        container_image(recipe),
        {"http": t.http_port, "grpc": t.grpc_port, "metrics": t.metrics_port},
        "/metrics",
        canary_script(
            t.http_port, backend.repo.interface, timeout_s=float(canary_timeout_s(recipe, sizing))
        ),
        container_mounts(recipe, triton_reads(recipe)),
        command,
        multi,
        keyed=True,
        triton=True,
        key_note=TRITON_KEY_NOTE,
        shm_gib=TRITON_SHM_GIB,
        host_tier_gib=host_tier_gib_per_pod(recipe, sizing),
    )
    if multi:
        launch.leader, launch.uses_ssh = command, True
    return launch


def slurm_rank_command(recipe: Recipe, launch: Launch) -> str:
    """One Slurm task's command (srun --mpi=pmix starts world-size tasks; PMIx gives each its MPI
    rank).

    Triton: rank 0 serves HTTP/gRPC/metrics, the others load only tensorrt_llm
    (launch_triton_server.py's split); the LLM API: every task runs trtllm-llmapi-launch, which
    makes rank 0 the server and the rest its workers.
    """
    if not launch.triton:
        key = f'export {launch.key_env}="${API_KEY_ENV}"\n' if launch.key_env else ""
        return key + "exec " + shell_join(launch.single)
    repo = container_artifacts(recipe).repo
    rank0 = shell_join(with_restricted(rank_command(recipe, repo, 0, host=CONTAINER_BIND)))
    other_cmd = with_restricted(rank_command(recipe, repo, 1, host=CONTAINER_BIND))
    prefix = next(t for t in other_cmd if t.endswith("shm-region-prefix-name=prefix1_"))
    other = shell_join(other_cmd, {prefix: shlex.quote(prefix[:-2]) + '"$SLURM_PROCID"_'})
    return f'if [ "$SLURM_PROCID" = 0 ]; then\n    exec {rank0}\nfi\nexec {other}'


RAY_ALIVE = (
    'python3 -c \'import ray; ray.init(address="auto", logging_level="ERROR"); '
    'print(sum(n["Alive"] for n in ray.nodes()))\' 2>/dev/null'
)


def ray_head(launch: Launch, nodes: str) -> str:
    """The Ray head, a wait (bounded) until `nodes` nodes are alive, then vLLM on the cluster."""
    return (
        f"ray start --head --port={RAY_PORT} && n=0 && "
        f'until [ "$({RAY_ALIVE})" -ge "{nodes}" ] 2>/dev/null; do n=$((n+1)); '
        f'[ $n -gt {SSH_WAIT_S // 5} ] && echo "Ray: fewer than {nodes} nodes after {SSH_WAIT_S} '
        's" >&2 && '
        f"exit 1; sleep 5; done && exec {shell_join(launch.leader)}"
    )


def dp_node_script(launch: Launch, address: str, node_index: str, leader: bool) -> str:
    """A node of a server that spreads its attention-DP ranks itself: the leader's command with
    the address, or a worker's from its first DP rank (`node_index` x ranks per node)."""
    cmd = launch.leader if leader else launch.dp_worker
    words = {DP_ADDRESS: address, DP_START: f'"$(({node_index} * {launch.dp_local}))"'}
    return "exec " + shell_join(cmd, words)


def ray_worker(address: str, node_port: int | None = None) -> str:
    """Join the head's Ray cluster, retrying until the head answers (it may start later than this
    pod); `node_port`: the raylet's fixed port (the pods' probes check it)."""
    port = f" --node-manager-port={node_port}" if node_port else ""
    return (
        f"until ray start --address={address}:{RAY_PORT}{port} --block; do echo 'Ray head not "
        "answering yet' >&2; sleep 5; done"
    )
