"""`trtkv generate`: greedy generation from a recipe's built engine, without a server.

- `reference`: trtkv's CPU runtime on the TensorRT-LLM checkpoint, read with TensorRT-LLM's defaults
  (so a checkpoint TensorRT-LLM would misread, e.g. without `rotary_base`, generates garbage here
  too).
- `tensorrt`: TensorRT-LLM's own `tensorrt_llm.runtime.ModelRunnerCpp` (the C++ executor Triton's
  backend runs, as its examples/run.py uses) on the engine (world size 1), where TensorRT-LLM lives
  (trtkv.platform.trtllm: TRTKV_TRTLLM_PYTHON, this python, or the container).
- `llmapi`: on a GPU recipe `tensorrt_llm.LLM` on the HF export with the recipe's KV dtype, in the
  same place; on hardware.gpu cpu trtkv's LLM-API-shaped engine (trtkv.runtime.llm) on the same HF
  export.
The GPU paths are written from TensorRT-LLM 1.2's APIs and were not executed on a machine without a
GPU.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from trtkv.backends import for_recipe
from trtkv.core.errors import StageError
from trtkv.platform import trtllm, versions
from trtkv.recipe import Recipe

# The runner scripts (trtkv.backends.<name>.generate_job) print the text after this marker line.
MARKER = "TRTKV_TEXT"
# `trtkv generate --max-tokens` (trtkv.cli.generate.GenerateOptions) and generate()'s default
DEFAULT_MAX_TOKENS = 16


def describe(
    recipe: Recipe, prompt: str, max_tokens: int, checkpoint: Path | None = None
) -> list[str]:
    """What `generate` would run (nothing is loaded)."""
    backend = for_recipe(recipe)
    if backend.serving.serves_locally(recipe):
        return [backend.runner.describe_local_generate(recipe, max_tokens, checkpoint)]
    script, args = backend.runner.generate_job(recipe, prompt, max_tokens)
    image = versions.image_for(recipe.build.tensorrt_llm_version)
    place = trtllm.where(image)
    cmd = place.python_command(["-c", "<runner>", json.dumps(args)])
    return [
        f"TensorRT-LLM runner ({place.kind}: {place.why}):",
        "  $ " + " ".join(cmd),
        "runner:",
        script,
    ]


def generate(
    recipe: Recipe,
    prompt: str,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    *,
    checkpoint: Path | None = None,
) -> str:
    """The generated text (prompt excluded)."""
    if max_tokens < 1:
        raise StageError(f"--max-tokens {max_tokens}: must be >= 1.")
    backend = for_recipe(recipe)
    if backend.serving.serves_locally(recipe):
        return backend.runner.local_generate(recipe, prompt, max_tokens, checkpoint)
    script, args = backend.runner.generate_job(recipe, prompt, max_tokens)
    image = versions.image_for(recipe.build.tensorrt_llm_version)
    place = trtllm.where(image)
    if place.kind == "missing":
        raise StageError(
            f"generate {recipe.name}: TensorRT-LLM is not available here ({place.why}). Next: "
            f"{trtllm.install_hint(image)}."
        )
    proc = subprocess.run(
        place.python_command(["-c", script, json.dumps(args)]),
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0 or MARKER not in proc.stdout:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-20:])
        raise StageError(
            f"generate {recipe.name}: the TensorRT-LLM runner failed (exit "
            f"{proc.returncode}):\n{tail}"
        )
    return proc.stdout.split(MARKER + "\n", 1)[1].rstrip("\n")
