"""Foundation layer: the machines trtkv targets: accelerators, the TensorRT-LLM/Triton version
matrix, and where TensorRT-LLM runs on this machine."""

__all__ = [
    "CUDA_CONTEXT_GIB",
    "GPU",
    "gpu_from_name",
    "GPU_SPECS",
    "gpus_where",
    "host_memory_bytes",
    "host_memory_gib",
    "known_gpus",
    "ONE_PER_SM",
    "Row",
    "trtllm",
    "versions",
]
