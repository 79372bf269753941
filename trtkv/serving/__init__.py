"""`trtkv serve`, `stop`, `status` and `generate`: starting a recipe's server (serve; the command
lines of the bundled CPU tritonserver and the GPU container are trtkv.backends', the container's id
and stop in container, the process and its record in launch, readiness in readiness), supervising
it (supervise; its record, events, liveness and stop in supervisor_state; health; the canary
request is trtkv.contracts.canary), ending it completely (teardown), and generating without a
server (generate)."""

from trtkv.core.lazy import attach

TYPE_CHECKING = False  # typing's, without loading typing (see trtkv.core.lazy)

if TYPE_CHECKING:
    from trtkv.serving.generate import DEFAULT_MAX_TOKENS
    from trtkv.serving.pool import describe

# each name's module is imported on first use: `trtkv stop` needs none of the launch code
__getattr__, __dir__ = attach(
    __name__,
    submodules=[
        "endpoint",
        "generate",
        "health",
        "pool",
        "serve",
        "supervise",
        "supervisor_state",
        "teardown",
    ],
    stub=__file__,
)

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "describe",
    "endpoint",
    "generate",
    "health",
    "pool",
    "serve",
    "supervise",
    "supervisor_state",
    "teardown",
]
