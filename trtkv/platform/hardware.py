"""Known accelerators: memory as CUDA reports it, bandwidth, compute capability (what FP8 / FP4 /
FlashAttention kernels exist), the names nvidia-smi prints and the label GPU feature discovery puts
on Kubernetes nodes.

Every figure names its source. `memory_gib` is the device's total as the CUDA runtime reports it
(cudaMemGetInfo / totalGlobalMem: what PyTorch prints as "GPU 0 has a total capacity of X GiB" and
vLLM multiplies by gpu_memory_utilization); it is below the NVML total nvidia-smi prints (e.g. H100
SXM: 81559 MiB = 79.65 GiB in nvidia-smi, 79.11 GiB in CUDA) and it varies by a few tenths of a GiB
with driver and ECC setting. Where no published CUDA figure was found the entry says so
(`memory_basis` "nvidia-smi" or "datasheet") and `hardware.memory_gib` overrides it for a user's own
machine. Bandwidth is the datasheet's (GB/s = 10^9 bytes/s).

`gfd_product` is GPU feature discovery's `nvidia.com/gpu.product` value: the NVML device name with
every space replaced by '-' (NVIDIA/k8s-device-plugin internal/lm/resource.go @02f65cca,
productLabel; "-SHARED" is appended when the GPU is time-sliced, which trtkv.platform.gpu_names
strips).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from trtkv.units import GIB

# The CUDA context and torch's own allocations before any engine memory, per GPU process: the SGLang
# logs hold ~0.3-0.5 GiB between the device total and "Load weight begin. avail mem" on one GPU
# (QwQ-32B on L4: 22.03 -> 21.63 with 0.13 of it NCCL). The same for every model and engine (the
# planner's engine rules and the probe's placement).
CUDA_CONTEXT_GIB = 0.4


class GPU(str, Enum):
    L4 = "L4"
    A10 = "A10"
    A10G = "A10G"
    L40 = "L40"
    L40S = "L40S"
    RTX_3090 = "RTX-3090"
    RTX_4070 = "RTX-4070"
    RTX_4080 = "RTX-4080"
    RTX_4090 = "RTX-4090"
    RTX_5090 = "RTX-5090"
    RTX_A5000 = "RTX-A5000"
    RTX_A6000 = "RTX-A6000"
    RTX_6000_ADA = "RTX-6000-Ada"
    RTX_PRO_6000 = "RTX-PRO-6000"
    A100_40GB = "A100-40GB"
    A100_80GB = "A100-80GB"
    H100_80GB = "H100-80GB"
    H100_PCIE = "H100-PCIE"
    H100_NVL = "H100-NVL"
    H20 = "H20"
    H200_141GB = "H200-141GB"
    GH200 = "GH200"
    GH200_144GB = "GH200-144GB"
    B200 = "B200"
    B300 = "B300"
    GB200 = "GB200"
    GB10 = "GB10"
    CPU = "cpu"


@dataclass(frozen=True)
class GPUSpec:
    memory_gib: float  # total as the CUDA runtime reports it (see memory_basis)
    hbm_bandwidth_gbps: float  # GB/s (10^9 bytes per second), datasheet
    arch: str
    sm: tuple[int, int]  # CUDA compute capability
    # nvidia.com/gpu.product (GPU feature discovery); published sources:
    # tests/data/gfd_products.json
    gfd_product: str
    # NVML / nvidia-smi device names, the first the one gfd_product is made from
    smi_names: tuple[str, ...]
    # "cuda" (a published CUDA total), "opencl" (the driver's global memory size through OpenCL),
    memory_basis: str
    # "nvidia-smi" (the NVML total, above CUDA's by ~0.5 GiB), "datasheet" (nominal GB as 10^9
    # bytes: below both)
    memory_source: str
    bandwidth_source: str

    @property
    def has_fp8(self) -> bool:
        """FP8 (E4M3/E5M2) tensor cores: SM89 (Ada) and later."""
        return self.sm >= (8, 9)

    @property
    def has_fp4(self) -> bool:
        """FP4 (E2M1, NVFP4/MXFP4) tensor cores: Blackwell, SM100/103 and SM120."""
        return self.sm[0] >= 10

    @property
    def nvfp4_kv(self) -> bool:
        """TensorRT-LLM's NVFP4 KV cache (its FP4 attention kernels): the datacenter Blackwell SMs
        only, SM100/103 (SM120, GeForce/RTX Pro Blackwell, has FP4 GEMMs but not these kernels)."""
        return self.sm in ((10, 0), (10, 3))

    @property
    def compute_capability(self) -> str:
        return f"{self.sm[0]}.{self.sm[1]}"


def _smi(mib: int) -> float:
    """An NVML total in MiB, in GiB."""
    return round(mib / 1024, 2)


def _datasheet(gb: float) -> float:
    """A datasheet's GB (10^9 bytes) in GiB: below what CUDA shows for the HBM parts, so a plan from
    it is safe."""
    return round(gb * 1e9 / GIB, 2)


def _derived(mib: int, ref_cuda_gib: float, ref_mib: int) -> float:
    """No published CUDA total: MiB x the nearest part's measured CUDA GiB per MiB."""
    return round(mib * ref_cuda_gib / ref_mib, 2)


_DS = "NVIDIA datasheet"
# Sources: owner/repo#N is a GitHub issue or pull request whose text holds the quoted figure.
GPU_SPECS: dict[GPU, GPUSpec] = {
    GPU.L4: GPUSpec(
        22.03,
        300.0,
        "Ada",
        (8, 9),
        "NVIDIA-L4",
        ("NVIDIA L4",),
        "cuda",
        "torch 'total capacity of 22.03 GiB' on an L4 (ArcInstitute/evo2#190); nvidia-smi 23034MiB "
        "(modal-labs/modal-client#2797)",
        f"{_DS}: 300 GB/s GDDR6",
    ),
    GPU.A10: GPUSpec(
        21.99,
        600.0,
        "Ampere",
        (8, 6),
        "NVIDIA-A10",
        ("NVIDIA A10",),
        "cuda",
        "torch 'total capacty of 21.99 GiB' on an A10 (zai-org/CogVLM#236); nvidia-smi 23028MiB "
        "(vllm-project/vllm#10034)",
        f"{_DS}: 600 GB/s GDDR6",
    ),
    GPU.A10G: GPUSpec(
        _smi(23028),
        600.0,
        "Ampere",
        (8, 6),
        "NVIDIA-A10G",
        ("NVIDIA A10G",),
        "nvidia-smi",
        "nvidia-smi 23028MiB (NVIDIA/TensorRT-LLM#7818); no CUDA total found (the A10 on the same "
        "23028MiB shows 21.99 GiB in CUDA)",
        "AWS G5 / NVIDIA A10G: 600 GB/s GDDR6",
    ),
    GPU.L40: GPUSpec(
        44.40,
        864.0,
        "Ada",
        (8, 9),
        "NVIDIA-L40",
        ("NVIDIA L40",),
        "cuda",
        "torch 'total capacity of 44.40 GiB' on an L40 (QwenLM/Qwen3-VL#2097)",
        f"{_DS}: 864 GB/s GDDR6",
    ),
    GPU.L40S: GPUSpec(
        44.53,
        864.0,
        "Ada",
        (8, 9),
        "NVIDIA-L40S",
        ("NVIDIA L40S",),
        "cuda",
        "torch 'total capacity of 44.53 GiB' on an L40S (Wan-Video/Wan2.1#205); nvidia-smi "
        "46068MiB (modal-labs/modal-client#2797)",
        f"{_DS}: 864 GB/s GDDR6",
    ),
    GPU.RTX_3090: GPUSpec(
        23.70,
        936.0,
        "Ampere",
        (8, 6),
        "NVIDIA-GeForce-RTX-3090",
        ("NVIDIA GeForce RTX 3090", "NVIDIA GeForce RTX 3090 Ti"),
        "cuda",
        "torch '23.70 GiB total capacity' on a 3090 (GaoLii/DSP#10)",
        f"{_DS}: 936 GB/s GDDR6X (the Ti's 1008 taken as the 3090's)",
    ),
    GPU.RTX_4070: GPUSpec(
        _derived(12282, 23.52, 24564),
        504.0,
        "Ada",
        (8, 9),
        "NVIDIA-GeForce-RTX-4070",
        ("NVIDIA GeForce RTX 4070", "NVIDIA GeForce RTX 4070 SUPER", "NVIDIA GeForce RTX 4070 Ti"),
        "derived",
        "nvidia-smi 12282MiB (meta-llama/llama#466) x RTX-4090's measured 23.52 GiB / 24564MiB",
        f"{_DS}: 504 GB/s GDDR6X (4070, 4070 SUPER, 4070 Ti; 12 GB each)",
    ),
    GPU.RTX_4080: GPUSpec(
        _derived(16384, 23.52, 24576),
        672.0,
        "Ada",
        (8, 9),
        "NVIDIA-GeForce-RTX-4080",
        (
            "NVIDIA GeForce RTX 4080",
            "NVIDIA GeForce RTX 4080 SUPER",
            "NVIDIA GeForce RTX 4070 Ti SUPER",
        ),
        "derived",
        "datasheet 16 GiB GDDR6X x RTX-4090's measured 23.52 GiB / 24 GiB; no CUDA total found",
        f"{_DS}: 672 GB/s GDDR6X (the 4070 Ti SUPER's; 4080 717, 4080 SUPER 736)",
    ),
    GPU.RTX_4090: GPUSpec(
        23.52,
        1008.0,
        "Ada",
        (8, 9),
        "NVIDIA-GeForce-RTX-4090",
        ("NVIDIA GeForce RTX 4090",),
        "cuda",
        "torch 'total capacity of 23.52 GiB' on a 4090 (Soul-AILab/SoulX-FlashTalk#5); "
        "nvidia-smi 24564MiB (vllm-project/vllm#7553)",
        f"{_DS}: 1008 GB/s GDDR6X",
    ),
    GPU.RTX_5090: GPUSpec(
        round(33680457728 / GIB, 2),
        1792.0,
        "Blackwell",
        (12, 0),
        "NVIDIA-GeForce-RTX-5090",
        ("NVIDIA GeForce RTX 5090",),
        "cuda",
        "deviceQuery 'Total amount of global memory: 32120 MBytes (33680457728 bytes)', compute "
        "capability 12.0 (NVIDIA/nccl#1637); nvidia-smi 32607MiB (noonghunna/club-3090#1322)",
        f"{_DS}: 1792 GB/s GDDR7",
    ),
    GPU.RTX_A5000: GPUSpec(
        _datasheet(24),
        768.0,
        "Ampere",
        (8, 6),
        "NVIDIA-RTX-A5000",
        ("NVIDIA RTX A5000",),
        "datasheet",
        "datasheet 24 GB GDDR6; no published CUDA total found",
        f"{_DS}: 768 GB/s",
    ),
    GPU.RTX_A6000: GPUSpec(
        _smi(46068),
        768.0,
        "Ampere",
        (8, 6),
        "NVIDIA-RTX-A6000",
        ("NVIDIA RTX A6000",),
        "nvidia-smi",
        "nvidia-smi 46068MiB with ECC on (thamada/gls gls/RTX_A6000_x9_smi.py; "
        "49140MiB with ECC off); no CUDA total found",
        f"{_DS}: 768 GB/s GDDR6",
    ),
    GPU.RTX_6000_ADA: GPUSpec(
        44.43,
        960.0,
        "Ada",
        (8, 9),
        "NVIDIA-RTX-6000-Ada-Generation",
        ("NVIDIA RTX 6000 Ada Generation",),
        "cuda",
        "torch 'total capacity of 44.43 GiB' beside nvidia-smi 46068MiB, ECC on "
        "(DINGYANB/MTVCrafter#21)",
        f"{_DS}: 960 GB/s GDDR6",
    ),
    GPU.RTX_PRO_6000: GPUSpec(
        _datasheet(96),
        1792.0,
        "Blackwell",
        (12, 0),
        "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition",
        (
            "NVIDIA RTX PRO 6000 Blackwell Server Edition",
            "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
        ),
        "datasheet",
        "datasheet 96 GB GDDR7; no published CUDA total found",
        f"{_DS}: 1792 GB/s GDDR7",
    ),
    GPU.A100_40GB: GPUSpec(
        round(42298834944 / GIB, 2),
        1555.0,
        "Ampere",
        (8, 0),
        "NVIDIA-A100-SXM4-40GB",
        ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB"),
        "cuda",
        "deviceQuery 'NVIDIA A100-SXM4-40GB ... 40339 MBytes (42298834944 bytes)' "
        "(bottlerocket-os/bottlerocket#3873); nvidia-smi 40960MiB (modal-labs/modal-client#2797)",
        f"{_DS}: 1555 GB/s HBM2 (SXM4)",
    ),
    GPU.A100_80GB: GPUSpec(
        79.25,
        2039.0,
        "Ampere",
        (8, 0),
        "NVIDIA-A100-SXM4-80GB",
        ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"),
        "cuda",
        "torch '79.25 GiB total capacity' on an A100 (levihsu/OOTDiffusion#235); nvidia-smi "
        "81920MiB (modal-labs/modal-client#2797)",
        f"{_DS}: 2039 GB/s HBM2e (SXM4; PCIe 1935)",
    ),
    GPU.H100_80GB: GPUSpec(
        79.11,
        3350.0,
        "Hopper",
        (9, 0),
        "NVIDIA-H100-80GB-HBM3",
        ("NVIDIA H100 80GB HBM3",),
        "cuda",
        "torch 'total capacity of 79.11 GiB' on an H100 (vllm-project/vllm#27508); "
        "nvidia-smi 81559MiB (vllm-project/vllm#55169)",
        f"{_DS}: 3350 GB/s HBM3 (SXM5)",
    ),
    GPU.H100_PCIE: GPUSpec(
        _derived(81559, 79.11, 81559),
        2000.0,
        "Hopper",
        (9, 0),
        "NVIDIA-H100-PCIe",
        ("NVIDIA H100 PCIe",),
        "derived",
        "nvidia-smi 81559MiB as the SXM part's (stored copy 59474166547) x H100-80GB's measured "
        "79.11 GiB / 81559MiB; no published CUDA total found (tests/data/gpu_memory_sources.json)",
        f"{_DS}: 2000 GB/s HBM2e",
    ),
    GPU.H100_NVL: GPUSpec(
        _smi(95830),
        3900.0,
        "Hopper",
        (9, 0),
        "NVIDIA-H100-NVL",
        ("NVIDIA H100 NVL",),
        "nvidia-smi",
        "nvidia-smi 95830MiB (NVIDIA/gpu-admin-tools#4); no CUDA total found",
        f"{_DS}: 3900 GB/s HBM3 (94 GB)",
    ),
    GPU.H20: GPUSpec(
        95.00,
        4000.0,
        "Hopper",
        (9, 0),
        "NVIDIA-H20",
        ("NVIDIA H20",),
        "cuda",
        "torch 'total capacity of 95.00 GiB' on an H20 96G (modelscope/DiffSynth-Studio#1238)",
        f"{_DS}: 4000 GB/s HBM3 (96 GB)",
    ),
    GPU.H200_141GB: GPUSpec(
        139.81,
        4800.0,
        "Hopper",
        (9, 0),
        "NVIDIA-H200",
        ("NVIDIA H200", "NVIDIA H200 NVL"),
        "cuda",
        "torch 'NVIDIA H200 (139.81 GiB)' (stored copy 59735414277); nvidia-smi 143771MiB, the "
        "NVL's too (sgl-project/sglang#3196; tests/data/gpu_memory_sources.json)",
        f"{_DS}: 4800 GB/s HBM3e (141 GB; H200 NVL the same)",
    ),
    GPU.GH200: GPUSpec(
        _smi(97280),
        4000.0,
        "Hopper",
        (9, 0),
        "NVIDIA-GH200-480GB",
        ("NVIDIA GH200 480GB",),
        "opencl",
        "OpenCL global memory '97280 MB VRAM' on 'NVIDIA GH200 480GB' "
        "(mredenti/PowerCapping configuration/OpenCL_benchmark.md); name as vllm-project/vllm#9630 "
        "prints it",
        f"{_DS}: 4000 GB/s HBM3 (96 GB)",
    ),
    GPU.GH200_144GB: GPUSpec(
        _datasheet(144),
        4900.0,
        "Hopper",
        (9, 0),
        "NVIDIA-GH200-144G-HBM3e",
        ("NVIDIA GH200 144G HBM3e",),
        "datasheet",
        "datasheet 144 GB HBM3e; name as vllm-project/vllm#18390 prints it",
        f"{_DS}: 4900 GB/s HBM3e",
    ),
    GPU.B200: GPUSpec(
        178.35,
        8000.0,
        "Blackwell",
        (10, 0),
        "NVIDIA-B200",
        ("NVIDIA B200",),
        "cuda",
        "CUDA totalGlobalMem 'Total Global Memory: 178.35 GB' (units of 2^30 bytes, beside "
        "nvidia-smi's 183359MiB = 179.06 GiB), compute capability 10.0 (pytorch/ao#4002); "
        "nvidia-smi 183359MiB (NVIDIA/TensorRT-LLM#10278)",
        f"{_DS}: 8000 GB/s HBM3e (pytorch/ao#4002 reads a 7680-bit bus: 7.67 TB/s)",
    ),
    GPU.B300: GPUSpec(
        _datasheet(288),
        8000.0,
        "Blackwell",
        (10, 3),
        "NVIDIA-B300-SXM6-AC",
        ("NVIDIA B300 SXM6 AC",),
        "datasheet",
        "datasheet 288 GB HBM3e; name as pytorch/ao#3640 prints it; gpu.product as NVIDIA NIM's "
        "support matrix lists it",
        f"{_DS}: 8000 GB/s HBM3e",
    ),
    GPU.GB200: GPUSpec(
        _datasheet(186),
        8000.0,
        "Blackwell",
        (10, 0),
        "NVIDIA-GB200",
        ("NVIDIA GB200",),
        "datasheet",
        "datasheet: GB200 NVL72 13.4 TB HBM3e over 72 GPUs = 186 GB each; name as "
        "vllm-project/vllm#33543 prints it",
        f"{_DS}: 8000 GB/s HBM3e",
    ),
    GPU.GB10: GPUSpec(
        121.69,
        273.0,
        "Blackwell",
        (12, 1),
        "NVIDIA-GB10",
        ("NVIDIA GB10",),
        "cuda",
        "'CUDA free caps at ~102/121.69 GiB' on a DGX Spark, shared with the host (MiaAI-Lab/"
        "GLM-5.3-Flash-EXL3-2x-DGX-Sparks#47); nvidia-smi prints none (unslothai/unsloth#10703)",
        f"{_DS} (DGX Spark): 273 GB/s LPDDR5x, 128 GB unified",
    ),
}
