"""The seam between trtkv's stages and its engine backends: one `EngineBackend` per recipe `build.backend`.

A backend says what its build stage does (and prints in a dry run), where the KV precision comes from, which Triton
`tensorrt_llm` model and ensemble step it needs, what the repository references, how many ranks it serves with and
whether the bundled CPU tritonserver runs it, and how `trtkv generate` runs it. The stages (`build`, `repo`, `serve`,
`generate`) look the backend up in `trtkv.backends.BACKENDS` instead of branching on its name; adding one is one module
plus its tests. Its recipe rules are data and code of the model layer: trtkv.recipe.backend_rules.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from trtkv.contracts.stage import manifest_hash
from trtkv.core import paths
from trtkv.core.errors import StageError
from trtkv.core.tools import quote
from trtkv.platform.hardware import GPU
from trtkv.recipe import Backend, Recipe
from trtkv.recipe.layout import checkpoint_dir, engine_dir

BUILD_SECTIONS = ("model", "quantization", "build")


class EngineBackend:
    """Defaults shared by the backends; each module overrides what differs."""

    backend: Backend
    llm_model: tuple[str, str | None]  # tensorrt_llm model templates: (config.pbtxt, model.py or None)
    llm_step_model = "tensorrt_llm"  # the ensemble's middle step
    repo_layout = "ensemble"  # "ensemble": inflight_batcher_llm's four models; "llmapi": upstream's one-model layout
    build_sections: tuple[str, ...] = BUILD_SECTIONS  # recipe sections the build output depends on
    copies_tokenizer = False  # True: the repository carries its own tokenizer copy (CPU); False: it references one
    records_versions = False  # True: the build manifest records the TensorRT-LLM/TensorRT that built the engine
    dynamo_framework: str | None = None  # NVIDIA Dynamo's backendFramework for this path (None: Dynamo cannot run it)
    gpu_engine = True  # False: trtkv's own CPU runtime (not a deployment target on a GPU)

    def serves_locally(self, recipe: Recipe) -> bool:
        """True: the bundled tritonserver runs it on this machine (hardware.gpu cpu); False: the GPU container."""
        return recipe.hardware.gpu is GPU.CPU

    def ranks(self, recipe: Recipe) -> int:
        """tritonserver processes per model instance (one per rank under mpirun for the engine path)."""
        return 1

    def kv_source_line(self, recipe: Recipe) -> str:
        raise NotImplementedError

    def prepare(self, recipe: Recipe) -> tuple[Path, dict[str, Any]]:
        """(checkpoint folder, preflight info) before the build; StageError listing every problem."""
        ckpt, _summary, problems = check_checkpoint(recipe)
        if problems:
            raise StageError(f"build {recipe.name}: the checkpoint does not fit the recipe:\n"
                             + "\n".join(f"  - {p}" for p in problems))
        return ckpt, {"checkpoint": str(ckpt)}

    def build(self, recipe: Recipe, ckpt: Path, tmp: Path, final: Path, info: dict[str, Any],
              log: Callable[[str], None]) -> dict[str, Any]:
        """Write the build output into `tmp` (renamed to `final` on success); returns manifest fields."""
        raise NotImplementedError

    def dry_run_lines(self, recipe: Recipe, ckpt: Path, out: Path) -> list[str]:
        raise NotImplementedError

    def require_served_input(self, recipe: Recipe) -> None:
        """StageError unless what the server loads is there (default: the build output)."""
        from trtkv.contracts.stage import require_input

        require_input(engine_dir(recipe), "serve", "build", recipe)

    def repo_input(self, recipe: Recipe) -> tuple[Path, str]:
        """What the Triton repository points at, and the stage that writes it."""
        return engine_dir(recipe), "build"

    def llm_module(self, recipe: Recipe) -> str:
        """The engine module a Python tensorrt_llm model imports (llmapi layout), else empty."""
        return ""

    def repo_files(self, recipe: Recipe) -> dict[str, str]:
        """Extra files of the Triton repository (relative path -> text)."""
        return {}

    def serve_command(self, recipe: Recipe) -> tuple[list[str], dict[str, str]]:
        """(command, extra environment) of a server that is not tritonserver (repo_layout "openai")."""
        raise StageError(f"backend {self.backend.value} is served by tritonserver (`trtkv serve` builds its command)")

    def repo_summary(self, recipe: Recipe) -> str:
        """One line for the repository README: what the tensorrt_llm model is."""
        raise NotImplementedError

    def repo_notes(self, recipe: Recipe) -> list[str]:
        """Extra README paragraphs for this backend's repository."""
        return []

    def describe_local_generate(self, recipe: Recipe, max_tokens: int, checkpoint: Path | None) -> str:
        """What `trtkv generate` runs on this machine (backends that serve locally)."""
        raise StageError(f"backend {self.backend.value} does not run on this machine")

    def local_generate(self, recipe: Recipe, prompt: str, max_tokens: int, checkpoint: Path | None) -> str:
        """Greedy text from the CPU engine (backends that serve locally)."""
        raise StageError(f"backend {self.backend.value} does not run on this machine")

    def generate_job(self, recipe: Recipe, prompt: str, max_tokens: int) -> tuple[str, dict[str, Any]]:
        """A runner script and its JSON arguments for TensorRT-LLM's own runner (GPU backends)."""
        raise StageError(f"backend {self.backend.value} has no TensorRT-LLM runner")


def failed_log_path(recipe: Recipe) -> Path:
    """Where a failed build's log is kept (the temporary engine folder itself is removed)."""
    return paths.recipe_output_dir(recipe.name) / "engine.failed-build.log"


def check_checkpoint(recipe: Recipe) -> tuple[Path, dict[str, Any], list[str]]:
    """The checkpoint folder, its validation summary and every problem with it (empty when it fits the recipe).

    One source of truth: trtkv.checkpoints.trtllm_checkpoint.validate_trtllm_checkpoint (the check calibrate runs after export).
    """
    from trtkv.checkpoints.trtllm_checkpoint import validate_trtllm_checkpoint

    ckpt = checkpoint_dir(recipe)
    if manifest_hash(ckpt) is None:
        return ckpt, {}, [f"{ckpt}: missing or incomplete (no manifest.json). Next: run `trtkv calibrate "
                          f"{recipe.name}` (or `make engine RECIPE={recipe.name}`, which runs calibrate then build)"]
    try:
        summary = validate_trtllm_checkpoint(ckpt, recipe)
    except StageError as exc:
        return ckpt, {}, [str(exc).replace("<recipe>", recipe.name) + " (or fix the recipe)"]
    return ckpt, summary, []


def command_block(cmd: list[str]) -> list[str]:
    """A command as copy-pasteable shell lines (flag/value pairs joined with backslash continuations)."""
    quoted = [quote([c]) for c in cmd]
    head, rest = quoted[:1], quoted[1:]
    parts: list[str] = []
    i = 0
    while i < len(rest):
        if rest[i].startswith("--") and i + 1 < len(rest) and not rest[i + 1].startswith("--"):
            parts.append(f"{rest[i]} {rest[i + 1]}")
            i += 2
        else:
            parts.append(rest[i])
            i += 1
    lines = [" ".join(head + parts[:1])] + parts[1:]
    return ["  $ " + lines[0] + (" \\" if len(lines) > 1 else "")] + [
        "      " + line + (" \\" if n < len(lines) - 2 else "") for n, line in enumerate(lines[1:])]


