"""Slurm batch scripts: srun --mpi=pmix with one task per rank in the container image (pyxis/enroot
--container-image), the artifacts mounted read-only at their canonical container paths
(/models/<recipe>/...); vLLM across nodes: one task per node, a Ray cluster.

Every GPU a job holds is used. A replica that fills whole nodes gets them (`--exclusive`); a smaller
one is packed: one job runs `instances` replicas side by side on one node (two TP4 on an 8-GPU
node), each a job step with its own GPUs (`srun --exact --gpus=N`), its own ports (PORT_STRIDE
apart) and its own shared-memory names, and asks for exactly those GPUs, with CPU and memory per GPU
from trtkv.deploy.resources, never --exclusive (the job checks that it holds no GPU it does not use:
SLURM_GPUS_ON_NODE).

Every value that reaches the scripts is quoted for the shell (shlex, token by token) or, in `#`
comments and `#SBATCH` lines, escaped so that no newline can end the comment: a recipe name or
folder is never a command.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from dataclasses import dataclass

from trtkv.core import paths
from trtkv.core.apikey import API_KEY_ENV
from trtkv.core.errors import StageError
from trtkv.deploy import launch as launches
from trtkv.deploy.launch import (
    REQUIRE_KEY,
    Launch,
    dp_node_script,
    enroot_image,
    ray_head,
    ray_worker,
    slurm_rank_command,
)
from trtkv.deploy.resources import server_resources
from trtkv.deploy.sizing import Sizing, tp_across_nodes
from trtkv.recipe import Recipe
from trtkv.recipe.layout import container_artifacts, repo_dir

RANK_SCRIPT = "rank.sh"
JOB_SCRIPT = "job.sbatch"
PORT_STRIDE = 10  # instance i of a packed job serves on the recipe's ports + 10 x i


def comment(text: str) -> str:
    """`text` safe inside a `#` comment line: control characters (a newline would end the comment)
    escaped."""
    return json.dumps(text)[1:-1]


def job_name(recipe: Recipe) -> str:
    """Slurm's job name: trtkv-<recipe> with anything but letters, digits, '_', '.' and '-' folded
    to '-'."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", f"trtkv-{recipe.name}")[:64]


@dataclass(frozen=True)
class Packing:
    """How a job holds GPUs: `instances` replicas per job on `nodes` node(s), `gpus_per_node` each,
    `jobs` submissions for every replica."""

    instances: int
    nodes: int
    gpus_per_node: int
    exclusive: bool
    jobs: int


def packing(sizing: Sizing) -> Packing:
    """Whole nodes for a replica that fills them; else as many replicas per node as fit (and are
    asked for)."""
    if sizing.nodes_per_replica > 1 or sizing.gpus_per_replica >= sizing.gpus_per_node:
        return Packing(1, sizing.nodes_per_replica, sizing.gpus_per_pod, True, sizing.replicas)
    k = max(1, min(sizing.replicas, sizing.gpus_per_node // sizing.gpus_per_replica))
    # no --exclusive for a packed job: a last, smaller submission (TRTKV_INSTANCES) must not hold
    # the whole node
    return Packing(k, 1, k * sizing.gpus_per_replica, False, math.ceil(sizing.replicas / k))


def shifted(recipe: Recipe, instance: int) -> Recipe:
    """The recipe with its ports moved for instance `instance` of a packed job."""
    if not instance:
        return recipe
    t, step = recipe.triton, PORT_STRIDE * instance
    ports = {
        "http_port": t.http_port + step,
        "grpc_port": t.grpc_port + step,
        "metrics_port": t.metrics_port + step,
    }
    return recipe.model_copy(update={"triton": t.model_copy(update=ports)})


def instance_command(recipe: Recipe, sizing: Sizing, instance: int) -> str:
    """One instance's task command (its ports, and its own shared-memory region names on a shared
    node)."""
    lch = launches.for_recipe(shifted(recipe, instance), sizing, slurm=True)
    text = slurm_rank_command(shifted(recipe, instance), lch)
    return (
        text.replace("shm-region-prefix-name=prefix", f"shm-region-prefix-name=i{instance}prefix")
        if instance
        else text
    )


def rank_script(recipe: Recipe, launch: Launch, sizing: Sizing) -> str:
    """What each task runs (inside the container); $TRTKV_INSTANCE picks a packed instance."""
    head = (
        f"#!/bin/bash\n# One task of trtkv deployment {comment(recipe.name)} ({launch.server}); "
        f"started by {JOB_SCRIPT}.\nset -euo pipefail\n"
        + (REQUIRE_KEY.rstrip("; ") + "\n" if launch.keyed else "")
    )
    if launch.ray_worker:
        return head + (
            f'if [ "$SLURM_NODEID" != 0 ]; then\n    {ray_worker("$TRTKV_HEAD")}\n    exit\nfi\n'
            "export "
            f'{launch.key_env}="${API_KEY_ENV}"\n{ray_head(launch, "$SLURM_JOB_NUM_NODES")}\n'
        )
    if launch.dp_worker:  # every node its own DP ranks, node 0 coordinating
        key = f'export {launch.key_env}="${API_KEY_ENV}"\n' if launch.key_env else ""
        worker = dp_node_script(launch, '"$TRTKV_HEAD"', "SLURM_NODEID", leader=False)
        leader = dp_node_script(launch, '"$TRTKV_HEAD"', "0", leader=True)
        return head + key + f'if [ "$SLURM_NODEID" != 0 ]; then\n    {worker}\nfi\n{leader}\n'
    pack = packing(sizing)
    if pack.instances == 1:
        return head + slurm_rank_command(recipe, launch) + "\n"
    cases = "".join(
        f"{i})\n{_indent(instance_command(recipe, sizing, i))}\n    ;;\n"
        for i in range(pack.instances)
    )
    return (
        head
        + f'case "${{TRTKV_INSTANCE:-0}}" in\n{cases}*)\n    echo "unknown TRTKV_INSTANCE" >&2; '
        "exit 2\n    ;;\nesac\n"
    )


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())


# pyxis's own syntax (its `srun --help`): no quoting or escaping of a ',' or ':' in a path
MOUNT_RULE = (
    "pyxis reads --container-mounts as SRC:DST[:FLAGS][,SRC:DST...] with no escaping, so a ',' "
    "or ':' in a path splits the list into other mounts"
)
MOUNT_SEPARATORS = ",:"


def check_mount_paths(recipe: Recipe, launch: Launch, here: str) -> None:
    """Refuse a path that would reach pyxis's mount list holding ',' or ':' (MOUNT_RULE): this
    folder, the engines and repositories folders and each mounted folder, host and container side.
    The job checks the same of the TRTKV_* folders it is given (`_MOUNT_GUARD`)."""
    named = [
        ("the output folder (--output)", here),
        ("the engines folder (TRTKV_ENGINES)", str(paths.engines_dir())),
        ("the repositories folder (TRTKV_TRITON_REPO)", str(repo_dir(recipe).parent)),
    ]
    for host, box in launch.folders:
        named += [("a folder the server reads", str(host)), ("its container path", str(box))]
    for what, path in named:
        bad = sorted({c for c in path if c in MOUNT_SEPARATORS})
        if bad:
            raise StageError(
                f"deploy {comment(recipe.name)} --target slurm: {what} {path!r} holds "
                f"{' and '.join(repr(c) for c in bad)}: {MOUNT_RULE}. Nothing was written. Next: "
                "use folders whose paths hold neither (--output, TRTKV_ENGINES, "
                "TRTKV_TRITON_REPO), e.g. a symbolic link without them to the same folder."
            )


# the same refusal in the job, for the folders sbatch is given (TRTKV_ENGINES, ...)
_MOUNT_GUARD = (
    'case "$ENGINES$REPOSITORIES$HERE" in *[,:]*) echo "trtkv: $ENGINES, $REPOSITORIES or $HERE '
    "holds ',' or ':', which split pyxis's --container-mounts list (SRC:DST[:FLAGS],...; no "
    'escaping): use folders without them" >&2; exit 1;; esac'
)


def _mounts(recipe: Recipe, launch: Launch) -> str:
    """pyxis --container-mounts: each folder the server reads, from $ENGINES (engines/) or
    $REPOSITORIES (triton_repo/) on a filesystem every node sees, to its canonical container path;
    this folder to /models/<recipe>/deploy."""
    engines, repos = paths.engines_dir(), repo_dir(recipe).parent
    words = []
    for host, box in launch.folders:
        root, rel = (
            ("ENGINES", host.relative_to(engines))
            if host.is_relative_to(engines)
            else ("REPOSITORIES", host.relative_to(repos))
        )
        words.append(f'"${root}"' + shlex.quote(f"/{rel}:{box}:ro,"))
    words.append('"$HERE"' + shlex.quote(f":{deploy_dir(recipe)}:ro"))
    return "".join(words)  # one shell word: the variables expanded, every name quoted


def deploy_dir(recipe: Recipe) -> str:
    """Where the job's folder (rank.sh) is in the container."""
    return str(container_artifacts(recipe).root / "deploy")


def instance_tasks(launch: Launch, sizing: Sizing) -> int:
    """Tasks per node of one instance: one where the server starts its own TP workers (vLLM, SGLang;
    across nodes a Ray cluster), one per rank where each rank is a process of its own (tritonserver,
    trtllm-llmapi-launch under srun --mpi=pmix)."""
    return 1 if launch.one_task_per_node else sizing.gpus_per_pod


def _srun(recipe: Recipe, launch: Launch, sizing: Sizing, pack: Packing) -> list[str]:
    per_node_tasks = instance_tasks(launch, sizing)
    tasks = sizing.nodes_per_replica * per_node_tasks
    mpi = "" if launch.one_task_per_node else " --mpi=pmix"
    box = [
        '    --container-image="$IMAGE" \\',
        '    --container-mounts="$MOUNTS" \\',
        "    --export=ALL \\",
        f"    bash {shlex.quote(deploy_dir(recipe) + '/' + RANK_SCRIPT)}",
    ]
    if pack.instances == 1:
        return [f"srun{mpi} --ntasks={tasks} --ntasks-per-node={per_node_tasks} \\", *box]
    step = sizing.gpus_per_replica
    return [
        "for i in $(seq 0 $((INSTANCES - 1))); do",
        f"  TRTKV_INSTANCE=$i srun --exact --nodes=1{mpi} --ntasks={per_node_tasks} "
        f"--gpus={step} \\",
        *[f"  {line}" for line in box[:-1]],
        f"  {box[-1]} &",
        "done",
        'status=0; for job in $(jobs -p); do wait "$job" || status=$?; done; exit $status',
    ]


def job_script(recipe: Recipe, launch: Launch, sizing: Sizing, here: str) -> str:
    """The sbatch file; `here`: the folder holding rank.sh (mounted read-only at
    /models/<recipe>/deploy)."""
    if any(ord(c) < 0x20 or c == "\x7f" for c in here):
        raise StageError(
            f"deploy {comment(recipe.name)} --target slurm: the output folder {here!r} holds a "
            "control character (a newline would end its #SBATCH line). Next: pass --output with a "
            "plain path."
        )
    check_mount_paths(recipe, launch, here)
    # across nodes: a Ray cluster, or vLLM's own data-parallel launch
    node_launch = launch.ray_worker or bool(launch.dp_worker)
    if launch.one_task_per_node and not node_launch and sizing.nodes_per_replica > 1:
        raise StageError(
            f"deploy {comment(recipe.name)} --target slurm: {launch.label} runs as one process "
            f"that starts its own {sizing.gpus_per_replica} TP/PP workers on its node, and trtkv "
            f"does not start it across nodes (a replica here needs {sizing.nodes_per_replica} "
            f"nodes of hardware.gpus_per_node = {sizing.gpus_per_node}). Nothing was written. "
            "Next: a replica that fits one node (build.tp_size x build.pp_size <= "
            "hardware.gpus_per_node), or another backend."
        )
    pack = packing(sizing)
    spread = tp_across_nodes(recipe)
    per_node_tasks = pack.instances * instance_tasks(launch, sizing)
    res = server_resources(sizing, launch.shm_gib, launch.host_tier_gib)
    key = (
        [
            f': "${{{API_KEY_ENV}:?export {API_KEY_ENV} (the key clients send; e.g. '
            f'{API_KEY_ENV}=$(cat ~/.trtkv-api-key)) before sbatch}}"',
            f"export {API_KEY_ENV}",
        ]
        if launch.keyed
        else []
    )
    holds = (
        ["#SBATCH --exclusive"]
        if pack.exclusive
        else [
            f"#SBATCH --cpus-per-gpu={math.ceil(res.cpu_limit / sizing.gpus_per_pod)}",
            f"#SBATCH --mem-per-gpu={math.ceil(res.memory_limit_gib / sizing.gpus_per_pod)}G",
        ]
    )
    port = launch.ports["http"]
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={job_name(recipe)}",
        f"#SBATCH --nodes={pack.nodes}",
        f"#SBATCH --ntasks-per-node={per_node_tasks}",
        f"#SBATCH --gpus-per-node={pack.gpus_per_node}",
        *holds,
        f"#SBATCH --output={shlex.quote(here)}/%x-%j.out",
        f"# trtkv deploy {comment(recipe.name)} --target slurm: {pack.instances} replica(s) of "
        f"{sizing.gpus_per_replica} GPU(s) per job, {pack.nodes} node(s); submit it {pack.jobs} "
        f"time(s) for {sizing.replicas} replica(s). Add your site's --account/--partition/--time.",
        *([f"# {comment(spread)}"] if spread else []),
        f"# Server: {launch.server}, image {comment(launch.image)} (override with "
        "TRTKV_IMAGE=...).",
        "set -euo pipefail",
        *key,
        f"DEFAULT_IMAGE={shlex.quote(enroot_image(launch.image))}  # enroot's REGISTRY#IMAGE:TAG "
        "form",
        "IMAGE=${TRTKV_IMAGE:-$DEFAULT_IMAGE}",
        "# the artifacts on a filesystem every node sees (the same variables trtkv reads)",
        f"ENGINES=${{TRTKV_ENGINES:-{shlex.quote(str(paths.engines_dir()))}}}",
        f"REPOSITORIES=${{TRTKV_TRITON_REPO:-{shlex.quote(str(repo_dir(recipe).parent))}}}",
        f"HERE=${{TRTKV_SLURM_DIR:-{shlex.quote(here)}}}",
        _MOUNT_GUARD,
        f"MOUNTS={_mounts(recipe, launch)}",
        f"INSTANCES=${{TRTKV_INSTANCES:-{pack.instances}}}",
        f"GPUS=${{SLURM_GPUS_ON_NODE:-$((INSTANCES * {sizing.gpus_per_pod}))}}",
        f'if [ "$GPUS" -ne $((INSTANCES * {sizing.gpus_per_pod})) ]; then echo "trtkv: this job '
        "holds $GPUS GPUs "
        f"per node but runs $INSTANCES x {sizing.gpus_per_pod}: every GPU held must be used "
        "(sbatch "
        f"--gpus-per-node=$((INSTANCES * {sizing.gpus_per_pod})) with "
        'TRTKV_INSTANCES=$INSTANCES)" >&2; exit 1; fi',
        'TRTKV_HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "export TRTKV_HEAD",
        "for i in $(seq 0 $((INSTANCES - 1))); do printf 'trtkv: %s answers on http://%s:%s once "
        "loaded\\n' "
        f'{shlex.quote(recipe.name)} "$TRTKV_HEAD" $(({port} + {PORT_STRIDE} * i)); done',
        *_srun(recipe, launch, sizing, pack),
    ]
    return "\n".join(lines) + "\n"
