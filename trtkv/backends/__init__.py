"""Engine backends behind a few small protocols (trtkv.backends.seam), one `EngineBackend` per
recipe build.backend, and the command lines of the servers the backends run: the bundled CPU
tritonserver (bundled) and the Triton TensorRT-LLM container (container), which `trtkv serve` runs,
`trtkv repo` prints and `trtkv deploy` puts in its pods.

Stages import only this package's face: `for_recipe` / `BACKENDS`, the protocol types and the
command lines; never a backend's module.
"""

from __future__ import annotations

from trtkv.backends import llmapi, llmapi_serve, reference, sglang, tensorrt, vllm
from trtkv.backends.seam import (
    DP_ADDRESS,
    DP_START,
    BuildJob,
    DynamoWorker,
    EngineBackend,
    MemoryRule,
    OpenAIServer,
    RepoLayout,
    TokenizerSource,
)
from trtkv.core.lazy import attach
from trtkv.recipe import Backend, Recipe

TYPE_CHECKING = False  # typing's, without loading typing (see trtkv.core.lazy)

if TYPE_CHECKING:
    from trtkv.backends.bundled import local_command, prepare_backends, python_libdir, server_env
    from trtkv.backends.container import (
        CONTAINER_BIND,
        CONTAINER_TRITONSERVER,
        TRITON_SHM_GIB,
        container_image,
        container_name,
        docker_command,
        gpu_command,
        inside_repo,
        launch_script_command,
        rank_command,
        shell_block,
        triton_reads,
        trtllm_serve_command,
        trtllm_serve_docker_command,
        trtllm_serve_server,
    )

# the command lines load on first use: they import this face (for_recipe)
__getattr__, __dir__ = attach(__name__, stub=__file__)

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
    "BuildJob",
    "CONTAINER_BIND",
    "container_image",
    "container_name",
    "CONTAINER_TRITONSERVER",
    "default_backend",
    "docker_command",
    "DP_ADDRESS",
    "DP_START",
    "DynamoWorker",
    "for_recipe",
    "gpu_command",
    "inside_repo",
    "launch_script_command",
    "local_command",
    "MemoryRule",
    "OpenAIServer",
    "prepare_backends",
    "python_libdir",
    "rank_command",
    "RepoLayout",
    "server_env",
    "shell_block",
    "TokenizerSource",
    "triton_reads",
    "TRITON_SHM_GIB",
    "trtllm_serve_command",
    "trtllm_serve_docker_command",
    "TRTLLM_SERVE_OPTIONS_FLAG",
    "trtllm_serve_server",
]
