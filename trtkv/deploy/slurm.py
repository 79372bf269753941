"""A Slurm batch script for one replica: srun --mpi=pmix with one task per rank in the container image (pyxis/enroot
--container-image), the artifacts mounted read-only at the paths the configs name; vLLM: one task per node, a Ray
cluster.

Every value that reaches the scripts is quoted for the shell (shlex, token by token) or, in `#` comments and
`#SBATCH` lines, escaped so that no newline can end the comment: a recipe name or folder is never a command.
"""

from __future__ import annotations

import json
import re
import shlex

from trtkv.core.apikey import API_KEY_ENV
from trtkv.core.errors import StageError
from trtkv.deploy.k8s import ray_head, ray_worker
from trtkv.deploy.launch import REQUIRE_KEY, Launch, enroot_image, slurm_rank_command
from trtkv.deploy.sizing import Sizing
from trtkv.recipe import Recipe

RANK_SCRIPT = "rank.sh"
JOB_SCRIPT = "job.sbatch"


def comment(text: str) -> str:
    """`text` safe inside a `#` comment line: control characters (a newline would end the comment) escaped."""
    return json.dumps(text)[1:-1]


def job_name(recipe: Recipe) -> str:
    """Slurm's job name: trtkv-<recipe> with anything but letters, digits, '_', '.' and '-' folded to '-'."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", f"trtkv-{recipe.name}")[:64]


def rank_script(recipe: Recipe, launch: Launch, sizing: Sizing) -> str:
    """What each task runs (inside the container)."""
    head = (f"#!/bin/bash\n# One task of trtkv deployment {comment(recipe.name)} ({launch.server}); started by "
            f"{JOB_SCRIPT}.\nset -euo pipefail\n" + (REQUIRE_KEY.rstrip("; ") + "\n" if launch.keyed else ""))
    if not launch.ray_worker:
        return head + slurm_rank_command(recipe, launch) + "\n"
    return head + (f'if [ "$SLURM_NODEID" != 0 ]; then\n    {ray_worker("$TRTKV_HEAD")}\n    exit\nfi\n'
                   f'export {launch.key_env}="${API_KEY_ENV}"\n{ray_head(launch, "$SLURM_JOB_NUM_NODES")}\n')


def job_script(recipe: Recipe, launch: Launch, sizing: Sizing, here: str) -> str:
    """The sbatch file; `here`: the folder holding rank.sh (mounted read-only into the container at the same path)."""
    if any(ord(c) < 0x20 or c == "\x7f" for c in here):
        raise StageError(f"deploy {comment(recipe.name)} --target slurm: the output folder {here!r} holds a control "
                         f"character (a newline would end its #SBATCH line). Next: pass --output with a plain path.")
    per_node_tasks = 1 if launch.one_task_per_node else sizing.gpus_per_pod  # vLLM: one task per node (Ray)
    tasks = sizing.nodes_per_replica * per_node_tasks
    # the server only reads the artifacts and rank.sh: pyxis mounts them read-only
    mounts = ",".join(f"{path}:{path}:ro" for _sub, path in launch.mounts) + f",{here}:{here}:ro"
    port = launch.ports["http"]
    key = ([f': "${{{API_KEY_ENV}:?export {API_KEY_ENV} (the key clients send; e.g. '
            f'{API_KEY_ENV}=$(cat ~/.trtkv-api-key)) before sbatch}}"', f"export {API_KEY_ENV}"]
           if launch.keyed else [])
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={job_name(recipe)}",
        f"#SBATCH --nodes={sizing.nodes_per_replica}",
        f"#SBATCH --ntasks-per-node={per_node_tasks}",
        f"#SBATCH --gpus-per-node={sizing.gpus_per_pod}",
        "#SBATCH --exclusive",
        f"#SBATCH --output={shlex.quote(here)}/%x-%j.out",
        f"# trtkv deploy {comment(recipe.name)} --target slurm: one replica ({sizing.gpus_per_replica} GPUs, "
        f"{sizing.nodes_per_replica} node(s)); submit once per replica. Add your site's --account/--partition/--time.",
        f"# Server: {launch.server}, image {comment(launch.image)} (override with TRTKV_IMAGE=...).",
        "set -euo pipefail",
        *key,
        f"DEFAULT_IMAGE={shlex.quote(enroot_image(launch.image))}  # enroot's REGISTRY#IMAGE:TAG form",
        'IMAGE=${TRTKV_IMAGE:-$DEFAULT_IMAGE}',
        'TRTKV_HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "export TRTKV_HEAD",
        f"printf 'trtkv: %s answers on http://%s:%s once loaded\\n' {shlex.quote(recipe.name)} \"$TRTKV_HEAD\" {port}",
        f"srun{'' if launch.one_task_per_node else ' --mpi=pmix'} --ntasks={tasks} --ntasks-per-node={per_node_tasks} \\",
        '    --container-image="$IMAGE" \\',
        f"    --container-mounts={shlex.quote(mounts)} \\",
        "    --export=ALL \\",
        f"    bash {shlex.quote(here + '/' + RANK_SCRIPT)}",
    ]
    return "\n".join(lines) + "\n"
