"""The GPU table's GPU-feature-discovery labels (GPUSpec.gfd_product, what `trtkv deploy` places pods by) against the
published sources in tests/data/gfd_products.json: each is GFD's rule applied to the GPU's NVML device name, and those
names are the ones vLLM's per-GPU tuned configs carry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtkv.platform.hardware import GPU, GPU_SPECS

DATA = json.loads((Path(__file__).parents[1] / "data" / "gfd_products.json").read_text())["products"]
VLLM_CONFIGS = "lib/python3.11/site-packages/vllm/model_executor/layers/fused_moe/configs"


def gfd_label(nvml_name: str) -> str:
    """GFD's productLabel: the device name with every space replaced by '-' (k8s-device-plugin internal/lm)."""
    return nvml_name.replace(" ", "-")


def test_the_table_holds_the_published_gfd_labels() -> None:
    """Every GPU with a published source carries that label and that NVML name in the table."""
    assert len(DATA) >= 5
    for gpu, row in DATA.items():
        spec = GPU_SPECS[GPU(gpu)]
        assert spec.gfd_product == row["gfd_product"], gpu
        assert row["nvml_name"] in spec.smi_names, gpu
        assert gfd_label(row["nvml_name"]) == row["gfd_product"], gpu
        assert row["nvml_name"].replace(" ", "_") == row["vllm_device_name"], gpu


@pytest.mark.e2e
def test_the_device_names_are_those_vllm_tunes_for() -> None:
    """vLLM 0.32.0 (.venv-vllm, `make install-vllm`) ships tuned configs named after each GPU's CUDA device name."""
    folder = Path(__file__).parents[2] / ".venv-vllm" / VLLM_CONFIGS
    names = {p.name.split("device_name=", 1)[1].split(",")[0].removesuffix(".json") for p in folder.glob("*device_name=*")}
    assert len(names) > 10, folder  # the package is there and ships its configs
    for gpu, row in DATA.items():
        assert row["vllm_device_name"] in names, gpu
