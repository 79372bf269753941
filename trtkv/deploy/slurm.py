"""A Slurm batch script for one replica: srun --mpi=pmix with one task per rank in the container image (pyxis/enroot
--container-image), the artifacts mounted at the paths the configs name; vLLM: one task per node, a Ray cluster."""

from __future__ import annotations

import shlex

from trtkv.deploy.k8s import ray_head, ray_worker
from trtkv.deploy.launch import Launch, enroot_image, slurm_rank_command
from trtkv.deploy.sizing import Sizing
from trtkv.recipe import Recipe

RANK_SCRIPT = "rank.sh"
JOB_SCRIPT = "job.sbatch"


def rank_script(recipe: Recipe, launch: Launch, sizing: Sizing) -> str:
    """What each task runs (inside the container)."""
    head = (f"#!/bin/bash\n# One task of trtkv deployment {recipe.name} ({launch.server}); started by {JOB_SCRIPT}.\n"
            "set -euo pipefail\n")
    if not launch.ray_worker:
        return head + slurm_rank_command(recipe, launch) + "\n"
    return head + (f'if [ "$SLURM_NODEID" != 0 ]; then\n    {ray_worker("$TRTKV_HEAD")}\n    exit\nfi\n'
                   f'{ray_head(launch, "$SLURM_JOB_NUM_NODES")}\n')


def job_script(recipe: Recipe, launch: Launch, sizing: Sizing, here: str) -> str:
    """The sbatch file; `here`: the folder holding rank.sh (mounted into the container at the same path)."""
    per_node_tasks = 1 if launch.server == "vllm" else sizing.gpus_per_pod  # vLLM: one task per node (Ray)
    tasks = sizing.nodes_per_replica * per_node_tasks
    mounts = ",".join(f"{path}:{path}" for _sub, path in launch.mounts) + f",{here}:{here}"
    port = launch.ports["http"]
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={shlex.quote('trtkv-' + recipe.name)}",
        f"#SBATCH --nodes={sizing.nodes_per_replica}",
        f"#SBATCH --ntasks-per-node={per_node_tasks}",
        f"#SBATCH --gpus-per-node={sizing.gpus_per_pod}",
        "#SBATCH --exclusive",
        f"#SBATCH --output={shlex.quote(here)}/%x-%j.out",
        f"# trtkv deploy {recipe.name} --target slurm: one replica ({sizing.gpus_per_replica} GPUs, "
        f"{sizing.nodes_per_replica} node(s)); submit once per replica. Add your site's --account/--partition/--time.",
        f"# Server: {launch.server}, image {launch.image} (override with TRTKV_IMAGE=...).",
        "set -euo pipefail",
        f"IMAGE=${{TRTKV_IMAGE:-{enroot_image(launch.image)}}}  # enroot's REGISTRY#IMAGE:TAG form",
        'TRTKV_HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "export TRTKV_HEAD",
        f'echo "trtkv: {recipe.name} answers on http://$TRTKV_HEAD:{port} once loaded"',
        f"srun{'' if launch.server == 'vllm' else ' --mpi=pmix'} --ntasks={tasks} --ntasks-per-node={per_node_tasks} \\",
        '    --container-image="$IMAGE" \\',
        f"    --container-mounts={shlex.quote(mounts)} \\",
        "    --export=ALL \\",
        f"    bash {shlex.quote(here + '/' + RANK_SCRIPT)}",
    ]
    return "\n".join(lines) + "\n"
