"""`trtkv serve`, `stop`, `status` and `generate`: starting a recipe's server (serve, container), supervising it
(supervise, health; the canary request is trtkv.contracts.canary), ending it completely (teardown), and generating
without a server (generate)."""

__all__ = [
    "container", "CONTAINER_BIND", "container_image", "CONTAINER_TRITONSERVER", "DEFAULT_MAX_TOKENS", "describe",
    "generate", "gpu_command", "health", "pool", "rank_command", "serve", "supervise", "triton_reads", "TRITON_SHM_GIB",
]
