"""Engine backends behind a few small protocols (trtkv.backends.seam), one `EngineBackend` per
recipe build.backend.

Stages import only this package's face: `for_recipe` / `BACKENDS` and the protocol types; never a
backend's module.
"""

from __future__ import annotations

from trtkv.backends import llmapi, llmapi_serve, reference, sglang, tensorrt, vllm
from trtkv.backends.seam import (
    DP_ADDRESS,
    DP_START,
    DynamoWorker,
    EngineBackend,
    MemoryRule,
    OpenAIServer,
    RepoLayout,
    TokenizerSource,
)
from trtkv.recipe import Backend, Recipe

# what `trtkv serve --trtllm-serve` passes the options YAML as
TRTLLM_SERVE_OPTIONS_FLAG = llmapi_serve.LLMAPI_OPTIONS_FLAG

BACKENDS: dict[Backend, EngineBackend] = {
    b.backend: b
    for b in (tensorrt.BACKEND, llmapi.BACKEND, reference.BACKEND, vllm.BACKEND, sglang.BACKEND)
}
_MISSING = sorted(b.value for b in Backend if b not in BACKENDS)
if _MISSING:  # pragma: no cover - a new enum value without its module
    raise RuntimeError(f"backends without a module in trtkv.backends: {_MISSING}")


def for_recipe(recipe: Recipe) -> EngineBackend:
    """The backend object of the recipe's build.backend."""
    return BACKENDS[recipe.build.backend]


def default_backend(*, on_cpu: bool, llama_family: bool) -> Backend:
    """The engine `trtkv init` picks when none is asked for: TensorRT-LLM's LLM API on a GPU (any
    architecture it runs); on the CPU trtkv's reference runtime for Llama-family models, else
    vLLM."""
    if not on_cpu:
        return Backend.LLMAPI
    return Backend.REFERENCE if llama_family else Backend.VLLM


__all__ = [
    "BACKENDS",
    "default_backend",
    "DP_ADDRESS",
    "DP_START",
    "DynamoWorker",
    "for_recipe",
    "MemoryRule",
    "OpenAIServer",
    "RepoLayout",
    "TokenizerSource",
    "TRTLLM_SERVE_OPTIONS_FLAG",
]
