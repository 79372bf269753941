"""`trtkv serve`, `stop`, `status` and `generate`: starting a recipe's server (serve; the bundled
CPU tritonserver in bundled, the GPU side in container, the process and its record in launch,
readiness in readiness), supervising it (supervise; its record, events, liveness and stop in
supervisor_state; health; the canary request is trtkv.contracts.canary), ending it completely
(teardown), and generating without a server (generate)."""

__all__ = [
    "bundled",
    "container",
    "CONTAINER_BIND",
    "container_image",
    "CONTAINER_TRITONSERVER",
    "DEFAULT_MAX_TOKENS",
    "describe",
    "generate",
    "gpu_command",
    "health",
    "pool",
    "rank_command",
    "serve",
    "supervise",
    "supervisor_state",
    "triton_reads",
    "TRITON_SHM_GIB",
]
