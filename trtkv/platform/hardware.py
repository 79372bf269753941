"""Known accelerators: memory, bandwidth and FP8 support (nominal datasheet figures)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class GPU(str, Enum):
    A100_80GB = "A100-80GB"
    H100_80GB = "H100-80GB"
    H200_141GB = "H200-141GB"
    L40S = "L40S"
    B200 = "B200"
    CPU = "cpu"


@dataclass(frozen=True)
class GPUSpec:
    memory_gib: float  # what the framework can address, about nvidia-smi's total
    hbm_bandwidth_gbps: float  # GB/s (10^9 bytes per second), datasheet
    has_fp8: bool
    arch: str
    # GPU feature discovery's node label nvidia.com/gpu.product: NVML's device name with every space replaced by '-'
    # (NVIDIA/k8s-device-plugin internal/lm/resource.go productLabel @02f65cca); `trtkv deploy` places pods by it.
    # Values and their published sources: tests/data/gfd_products.json.
    gfd_product: str = ""


# Datasheet figures: A100 SXM 80GB 2,039 GB/s; H100 SXM 3,350 GB/s; H200 4,800 GB/s;
# L40S 48 GB GDDR6 864 GB/s; B200 180 GB 8,000 GB/s. Memory in GiB as nvidia-smi reports it.
GPU_SPECS: dict[GPU, GPUSpec] = {
    GPU.A100_80GB: GPUSpec(80.0, 2039.0, False, "Ampere", gfd_product="NVIDIA-A100-SXM4-80GB"),
    GPU.H100_80GB: GPUSpec(79.6, 3350.0, True, "Hopper", gfd_product="NVIDIA-H100-80GB-HBM3"),
    GPU.H200_141GB: GPUSpec(140.4, 4800.0, True, "Hopper", gfd_product="NVIDIA-H200"),
    GPU.L40S: GPUSpec(45.0, 864.0, True, "Ada", gfd_product="NVIDIA-L40S"),
    GPU.B200: GPUSpec(179.1, 8000.0, True, "Blackwell", gfd_product="NVIDIA-B200"),
}


def gpus_with_arch(arch: str) -> list[str]:
    return [g.value for g, s in GPU_SPECS.items() if s.arch == arch]


def gpus_with_fp8() -> list[str]:
    return [g.value for g, s in GPU_SPECS.items() if s.has_fp8]
