"""`trtkv serve`, `stop`, `status` and `generate`: starting a recipe's server (serve; the bundled
CPU tritonserver in bundled, the GPU side in container, the process and its record in launch,
readiness in readiness), supervising it (supervise; its record, events, liveness and stop in
supervisor_state; health; the canary request is trtkv.contracts.canary), ending it completely
(teardown), and generating without a server (generate)."""

from trtkv.core.lazy import attach

TYPE_CHECKING = False  # typing's, without loading typing (see trtkv.core.lazy)

if TYPE_CHECKING:
    from trtkv.serving.container import (
        CONTAINER_BIND,
        CONTAINER_TRITONSERVER,
        TRITON_SHM_GIB,
        container_image,
        gpu_command,
        rank_command,
        triton_reads,
    )
    from trtkv.serving.generate import DEFAULT_MAX_TOKENS
    from trtkv.serving.pool import describe

# each name's module is imported on first use: `trtkv stop` needs none of the launch code
__getattr__, __dir__ = attach(
    __name__,
    submodules=[
        "bundled",
        "container",
        "endpoint",
        "generate",
        "health",
        "pool",
        "serve",
        "supervise",
        "supervisor_state",
        "teardown",
    ],
    submod_attrs={
        "container": [
            "CONTAINER_BIND",
            "container_image",
            "CONTAINER_TRITONSERVER",
            "gpu_command",
            "rank_command",
            "triton_reads",
            "TRITON_SHM_GIB",
        ],
        "generate": ["DEFAULT_MAX_TOKENS"],
        "pool": ["describe"],
    },
)

__all__ = [
    "bundled",
    "container",
    "CONTAINER_BIND",
    "container_image",
    "CONTAINER_TRITONSERVER",
    "DEFAULT_MAX_TOKENS",
    "describe",
    "endpoint",
    "generate",
    "gpu_command",
    "health",
    "pool",
    "rank_command",
    "serve",
    "supervise",
    "supervisor_state",
    "teardown",
    "triton_reads",
    "TRITON_SHM_GIB",
]
