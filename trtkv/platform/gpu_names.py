"""The words that name a GPU of trtkv's table (trtkv.platform.hardware): trtkv's values, the names
nvidia-smi prints, GPU feature discovery's `nvidia.com/gpu.product` labels (with or without the
"-SHARED" of a time-sliced GPU) and the common aliases users type."""

from __future__ import annotations

import re

from trtkv.platform.hardware import GPU, GPU_SPECS

# Other spellings users type (lower-case); the enum value, nvidia-smi names and gfd_product are
# accepted as well.
ALIASES: dict[str, GPU] = {
    "h100": GPU.H100_80GB,
    "h100-sxm": GPU.H100_80GB,
    "h100-sxm5": GPU.H100_80GB,
    "h100 sxm": GPU.H100_80GB,
    "h100-pcie-80gb": GPU.H100_PCIE,
    "h200": GPU.H200_141GB,
    "a100": GPU.A100_80GB,
    "a100-sxm4-80gb": GPU.A100_80GB,
    "a100-sxm4-40gb": GPU.A100_40GB,
    "rtx 3090": GPU.RTX_3090,
    "3090": GPU.RTX_3090,
    "rtx 4070": GPU.RTX_4070,
    "4070": GPU.RTX_4070,
    "rtx 4080": GPU.RTX_4080,
    "4080": GPU.RTX_4080,
    "rtx 4090": GPU.RTX_4090,
    "4090": GPU.RTX_4090,
    "rtx 5090": GPU.RTX_5090,
    "5090": GPU.RTX_5090,
    "a5000": GPU.RTX_A5000,
    "a6000": GPU.RTX_A6000,
    "rtx 6000 ada": GPU.RTX_6000_ADA,
    "rtx pro 6000": GPU.RTX_PRO_6000,
    "b300-sxm6-ac": GPU.B300,
    "gh200-480gb": GPU.GH200,
    "h200 nvl": GPU.H200_141GB,
    "dgx spark": GPU.GB10,
}
_SPACES = re.compile(r"\s+")


def _key(text: str) -> str:
    return _SPACES.sub(" ", text.strip()).lower()


def _names() -> dict[str, GPU]:
    out = {_key(g.value): g for g in GPU}
    for gpu, spec in GPU_SPECS.items():
        out[_key(spec.gfd_product)] = gpu
        for name in spec.smi_names:
            out[_key(name)] = gpu
            out[_key(name.replace(" ", "-"))] = gpu  # the gfd_product spelling of every NVML name
    out.update(ALIASES)
    return out


NAMES = _names()


def gpu_from_name(text: str) -> GPU | None:
    """The GPU a user's word names: trtkv's value (H100-80GB), a name as nvidia-smi prints it
    (NVIDIA H100 80GB HBM3), a GFD gpu.product label (NVIDIA-H100-80GB-HBM3, with or without
    -SHARED), or a common alias (H100)."""
    key = _key(text)
    if key.endswith("-shared"):
        key = key[: -len("-shared")]
    return NAMES.get(key)


def known_gpus() -> str:
    """`L4, A10, ...`: the values a recipe or `--gpu` takes (plus nvidia-smi's names)."""
    return ", ".join(g.value for g in GPU)
