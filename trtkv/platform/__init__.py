"""Foundation layer: the machines trtkv targets: accelerators, the TensorRT-LLM/Triton version
matrix, and where TensorRT-LLM runs on this machine."""

from trtkv.core.lazy import attach

TYPE_CHECKING = False  # typing's, without loading typing (see trtkv.core.lazy)

if TYPE_CHECKING:
    from trtkv.platform.gpu_capabilities import ONE_PER_SM, gpus_where
    from trtkv.platform.gpu_names import gpu_from_name, known_gpus
    from trtkv.platform.hardware import CUDA_CONTEXT_GIB, GPU, GPU_SPECS
    from trtkv.platform.host import auto_threads, host_memory_bytes, host_memory_gib
    from trtkv.platform.host_link import HostLink, host_link_of
    from trtkv.platform.versions import Row

# each name's module is imported on first use (the version matrix reads its JSON then)
__getattr__, __dir__ = attach(__name__, submodules=["host", "trtllm", "versions"], stub=__file__)

__all__ = [
    "auto_threads",
    "CUDA_CONTEXT_GIB",
    "GPU",
    "gpu_from_name",
    "GPU_SPECS",
    "gpus_where",
    "host",
    "host_link_of",
    "host_memory_bytes",
    "host_memory_gib",
    "HostLink",
    "known_gpus",
    "ONE_PER_SM",
    "Row",
    "trtllm",
    "versions",
]
