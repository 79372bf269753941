"""One place for the stage folders of a recipe and the recipe-enum -> TensorRT-LLM name maps.

engines/<recipe>/checkpoint (calibrate; its tokenizer/ and hf/), engine (build), serve (serve),
bench and fidelity (bench), probe (probe), report (report); triton_repo/<recipe> (repo). No other
module spells these names. WEIGHT_ALGOS and kv_cache_quant_algo (the KV-format registry row's
checkpoint_algo) say what a TensorRT-LLM checkpoint's `quantization` fields hold for each recipe
choice; calibrate, checkpoint, build, runtime, serve and repo all read them from
here. Light: no heavy imports (`trtkv validate/plan` start fast).

Two views of the same folders (`Artifacts`): this host's, and the canonical container paths under
CONTAINER_ROOT (/models/<recipe>/{checkpoint,engine,triton_repo}) that every file a container reads
names (the Triton repository's configs, model.yaml, the served commands, the deploy files); `docker
run -v`, pyxis mounts and the Kubernetes models volume put the host folders there. A recipe served
on this machine's CPU keeps the host view (`served_artifacts`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trtkv.core import paths
from trtkv.platform.hardware import GPU
from trtkv.recipe import WeightQuant

if TYPE_CHECKING:
    from trtkv.recipe import Recipe

CHECKPOINT = "checkpoint"
ENGINE = "engine"
SERVE = "serve"
BENCH = "bench"
FIDELITY = "fidelity"  # the bench's fidelity task: its reference and prediction scorers' caches
PROBE = "probe"
REPORT = "report"
# checkpoint/tokenizer: Triton's pre/postprocessing, the LLM API and trtllm-serve read it
TOKENIZER = "tokenizer"
HF = "hf"  # checkpoint/hf: the HF export (ModelOpt's unified checkpoint)
# The model's own HF config.json, saved by calibrate (an INT8-KV checkpoint has no hf/ export to
# read it from).
HF_CONFIG = "hf_config.json"

# recipe quantization.weights -> the quant_algo values a checkpoint may carry for it (ModelOpt /
# TensorRT-LLM QuantAlgo names; the first is what ModelOpt writes by default)
WEIGHT_ALGOS: dict[WeightQuant, tuple[str | None, ...]] = {
    WeightQuant.FP8: ("FP8",),
    WeightQuant.INT8_SQ: (
        "W8A8_SQ_PER_CHANNEL",
        "W8A8_SQ_PER_CHANNEL_PER_TOKEN_PLUGIN",
        "W8A8_SQ_PER_CHANNEL_PER_TENSOR_PLUGIN",
        "W8A8_SQ_PER_TENSOR_PLUGIN",
    ),
    WeightQuant.INT4_AWQ: ("W4A16_AWQ", "W4A8_AWQ"),
    WeightQuant.NONE: (None,),
}


def kv_cache_quant_algo(recipe: Recipe) -> str | None:
    """The checkpoint's `quantization.kv_cache_quant_algo` for this recipe ("FP8", "INT8", "NVFP4"
    or None: the registry row's checkpoint_algo; the engine formats export no KV quantization)."""
    return recipe.kv_row.choice.checkpoint_algo


def checkpoint_dir(recipe: Recipe) -> Path:
    """engines/<recipe>/checkpoint: written by `trtkv calibrate`."""
    return paths.recipe_output_dir(recipe.name) / CHECKPOINT


def engine_dir(recipe: Recipe) -> Path:
    """engines/<recipe>/engine: written by `trtkv build`."""
    return paths.recipe_output_dir(recipe.name) / ENGINE


def serve_dir(recipe: Recipe) -> Path:
    """engines/<recipe>/serve: server.json, the server log and the CPU backend links (`trtkv
    serve`)."""
    return paths.recipe_output_dir(recipe.name) / SERVE


def checkpoint_tokenizer_dir(recipe: Recipe) -> Path:
    """engines/<recipe>/checkpoint/tokenizer: the model's tokenizer files, saved by `trtkv
    calibrate`."""
    return checkpoint_dir(recipe) / TOKENIZER


def bench_dir(recipe: Recipe) -> Path:
    """engines/<recipe>/bench: results.json and the per-request records (`trtkv bench`'s default
    --output)."""
    return paths.recipe_output_dir(recipe.name) / BENCH


def fidelity_dir(recipe: Recipe) -> Path:
    """engines/<recipe>/fidelity: the fidelity task's cached reference and prediction scores."""
    return paths.recipe_output_dir(recipe.name) / FIDELITY


def probe_dir(recipe: Recipe) -> Path:
    """engines/<recipe>/probe: probe.json (`trtkv probe`'s default --output)."""
    return paths.recipe_output_dir(recipe.name) / PROBE


def report_dir(recipe: Recipe) -> Path:
    """engines/<recipe>/report: report.json and report.md (`trtkv report`)."""
    return paths.recipe_output_dir(recipe.name) / REPORT


def repo_dir(recipe: Recipe) -> Path:
    """triton_repo/<recipe>: written by `trtkv repo`."""
    return paths.recipe_folder(paths.triton_repo_dir(), recipe.name)


# ---------------------------------------------------------------------------------------------
# Where a server sees the artifacts: this host, or the canonical container paths

CONTAINER_ROOT = Path("/models")  # one root in every container: /models/<recipe>/...
REPO_FOLDER = "triton_repo"  # /models/<recipe>/triton_repo: the Triton repository in a container


@dataclass(frozen=True)
class Artifacts:
    """One recipe's artifact folders as one side sees them: `root` holds checkpoint/ and engine/,
    `repo` the Triton repository."""

    root: Path
    repo: Path

    @property
    def checkpoint(self) -> Path:
        return self.root / CHECKPOINT

    @property
    def engine(self) -> Path:
        return self.root / ENGINE

    @property
    def hf(self) -> Path:
        """The HF export (ModelOpt's unified checkpoint) the LLM API, vLLM, SGLang and Dynamo
        load."""
        return self.checkpoint / HF

    @property
    def tokenizer(self) -> Path:
        return self.checkpoint / TOKENIZER


def host_artifacts(recipe: Recipe) -> Artifacts:
    """The folders on this machine (engines/<recipe>, triton_repo/<recipe>)."""
    return Artifacts(paths.recipe_output_dir(recipe.name), repo_dir(recipe))


def container_artifacts(recipe: Recipe) -> Artifacts:
    """The canonical container paths: /models/<recipe>/{checkpoint,engine,triton_repo}."""
    root = paths.recipe_folder(CONTAINER_ROOT, recipe.name)
    return Artifacts(root, root / REPO_FOLDER)


def served_artifacts(recipe: Recipe) -> Artifacts:
    """Where this recipe's server reads them: the host folders for a recipe served on this machine's
    CPU, else the container paths (every GPU server runs in a container: docker, Kubernetes, Slurm's
    pyxis, Dynamo)."""
    return host_artifacts(recipe) if recipe.hardware.gpu is GPU.CPU else container_artifacts(recipe)


def to_container(recipe: Recipe, host_path: Path) -> Path:
    """The container path of a host folder of this recipe (under engines/<recipe> or
    triton_repo/<recipe>)."""
    host, box = host_artifacts(recipe), container_artifacts(recipe)
    for here, there in ((host.repo, box.repo), (host.root, box.root)):
        if host_path == here or host_path.is_relative_to(here):
            return there / host_path.relative_to(here)
    raise ValueError(f"{host_path} is not under {host.root} or {host.repo}")


def served_path(recipe: Recipe, host_path: Path) -> Path:
    """A host folder of this recipe as its server sees it (served_artifacts)."""
    return host_path if recipe.hardware.gpu is GPU.CPU else to_container(recipe, host_path)


def container_mounts(recipe: Recipe, folders: list[Path]) -> list[tuple[Path, Path]]:
    """(host folder, container folder) for each folder a server reads, in order, without
    duplicates."""
    return [(f, to_container(recipe, f)) for f in dict.fromkeys(folders)]
