"""Packed Slurm jobs start one server per instance: job.sbatch run with srun stubbed, the stub starting rank.sh once
per task it is asked for (SLURM_PROCID set), and each engine's entry point stubbed to log itself. A process is a
server of its own unless it is a rank > 0 of an MPI world (srun --mpi=pmix) of an engine launched per rank
(tritonserver's ranks, trtllm-llmapi-launch); vLLM and SGLang start their own TP workers, so each task of theirs is a
whole TP server."""

from __future__ import annotations

import re
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest

from tests.support.planned import deploy
from trtkv.core.errors import StageError
from trtkv.deploy import Target
from trtkv.recipe import load_recipe

# recipe -> (per-rank MPI launch?, GPUs per replica)
ENGINES = {
    "llama70b_fp8kv": True,  # tritonserver, one per rank
    "llama70b_fp8kv_llmapi": True,  # trtllm-llmapi-launch trtllm-serve, one per rank
    "llama70b_fp8kv_attnhead_vllm": False,  # vllm serve starts its TP workers
    "llama70b_fp8kv_sglang": False,  # sglang.launch_server starts its TP workers
}
PER_RANK = ("tritonserver", "trtllm-llmapi-launch")

SRUN = """#!/bin/bash
# the step's task count and MPI flag, then rank.sh once per task (this folder's copy)
n=1; mpi=no
for a in "$@"; do case "$a" in --ntasks=*) n=${a#--ntasks=};; --mpi=pmix) mpi=yes;; esac; done
echo "step $TRTKV_INSTANCE $n $mpi $*" >> "$LOG"
for p in $(seq 0 $((n - 1))); do
    SLURM_PROCID=$p SLURM_NODEID=0 TRTKV_MPI=$mpi bash "$RANK" &
done
wait
"""
ENTRY = '#!/bin/sh\necho "run $TRTKV_INSTANCE $SLURM_PROCID $TRTKV_MPI $(basename "$0") $*" >> "$LOG"\n'


def run_job(out: Path, tmp: Path) -> list[str]:
    """job.sbatch executed with srun stubbed and the engines' entry points logging their start."""
    stubs = tmp / "bin"
    stubs.mkdir()
    (stubs / "srun").write_text(SRUN)
    (stubs / "scontrol").write_text("#!/bin/sh\necho node1\n")
    for entry in ("tritonserver", "trtllm-llmapi-launch", "vllm", "python3"):
        (stubs / entry).write_text(ENTRY)
    for s in stubs.iterdir():
        s.chmod(0o755)
    rank = tmp / "rank.sh"  # the container's /opt/tritonserver/bin/tritonserver found on PATH here
    rank.write_text((out / "rank.sh").read_text().replace("/opt/tritonserver/bin/tritonserver", "tritonserver"))
    gpus = re.search(r"#SBATCH --gpus-per-node=(\d+)", (out / "job.sbatch").read_text())
    assert gpus
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "TRTKV_API_KEY": "k", "SLURM_JOB_NODELIST": "node1",
           "SLURM_GPUS_ON_NODE": gpus.group(1), "LOG": str(tmp / "log"), "RANK": str(rank)}
    done = subprocess.run(["bash", str(out / "job.sbatch")], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return (tmp / "log").read_text().splitlines()


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_a_packed_job_starts_one_server_per_instance(name: str, tmp_path: Path) -> None:
    recipe = load_recipe(name)
    tp = recipe.world_size
    out = deploy(recipe, Target.SLURM, tmp_path / "out", replicas=2, log=lambda _m: None)
    job = (out / "job.sbatch").read_text()
    lines = run_job(out, tmp_path)
    steps = [line.split() for line in lines if line.startswith("step ")]
    runs = [line.split() for line in lines if line.startswith("run ")]
    servers: dict[str, int] = defaultdict(int)
    processes: dict[str, int] = defaultdict(int)
    for _run, instance, procid, mpi, entry, *_args in runs:
        processes[instance] += 1
        if not (mpi == "yes" and entry in PER_RANK and procid != "0"):  # a rank > 0 of an MPI world serves nothing
            servers[instance] += 1
    assert sorted(servers) == ["0", "1"] and len(steps) == 2
    assert servers == {"0": 1, "1": 1}, (name, lines)  # one server per instance, not one per task
    per_rank = ENGINES[name]
    assert processes == {"0": tp if per_rank else 1, "1": tp if per_rank else 1}, (name, lines)
    assert all((s[3] == "yes") == per_rank and f"--gpus={tp}" in s for s in steps), steps
    # the allocation holds the tasks its steps run
    held = re.search(r"#SBATCH --ntasks-per-node=(\d+)", job)
    assert held and int(held.group(1)) == sum(int(s[2]) for s in steps)


def test_one_process_engines_are_refused_across_nodes_and_tp_across_nodes_is_warned(tmp_path: Path) -> None:
    """SGLang's one process cannot span nodes under Slurm (trtkv starts no multi-node SGLang): refused with the
    reason; a TP group wider than a node is written with a warning in the job and the log."""
    four = ["hardware.gpus_per_node=2"]
    with pytest.raises(StageError, match="starts its own 4 TP/PP workers on its node"):
        deploy(load_recipe("llama70b_fp8kv_sglang", four), Target.SLURM, tmp_path / "s", log=lambda _m: None)
    said: list[str] = []
    recipe = load_recipe("llama70b_fp8kv", ["build.tp_size=16", "hardware.count=16"])
    out = deploy(recipe, Target.SLURM, tmp_path / "t", log=said.append)
    warning = next(m for m in said if m.startswith("warning:"))
    assert "build.tp_size = 16 spans 2 nodes" in warning and "build.tp_size=8 build.pp_size=2" in warning
    assert "# warning: llama70b_fp8kv: build.tp_size = 16 spans 2 nodes" in (out / "job.sbatch").read_text()
    quiet: list[str] = []
    deploy(load_recipe("llama70b_fp8kv", ["build.tp_size=8", "build.pp_size=2", "hardware.count=16"]), Target.SLURM,
           tmp_path / "p", log=quiet.append)
    assert not [m for m in quiet if m.startswith("warning:")]
