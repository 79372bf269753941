"""quantization.kv_cache's engine formats: accepted where trtkv/data/kv_formats.json gives the backend's engine a row
and an attention backend runs on hardware.gpu, refused otherwise with the engine that serves it and an alternative."""

from __future__ import annotations

import dataclasses
import re

import pytest

from trtkv.backends import vllm, vllm_command
from trtkv.core.errors import StageError, TrtkvError
from trtkv.kvcache import engines
from trtkv.recipe import load_recipe
from trtkv.recipe.engine_formats import capability_holds
from trtkv.recipe.layout import kv_cache_quant_algo
from trtkv.recipe.schema import ENGINE_KV_FORMATS, KVCacheQuant

GPU_VLLM = ["build.backend=vllm"]  # llama70b_fp8kv: 4 x H100-80GB
VLLM_GPU_FORMATS = ["fp8_cast", "int8_per_token_head", "fp8_per_token_head", "int4_per_token_head", "turboquant_k8v4",
                    "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc", "ultraquant_4bit"]


def _problems(base: str, overrides: list[str]) -> str:
    try:
        load_recipe(base, overrides)
    except TrtkvError as exc:
        return str(exc)
    return ""


@pytest.mark.parametrize("kv", VLLM_GPU_FORMATS)
def test_vllm_on_h100_accepts_each_engine_format_and_serves_the_tables_value(kv: str) -> None:
    recipe = load_recipe("llama70b_fp8kv", [*GPU_VLLM, f"quantization.kv_cache={kv}"])
    want = engines.load_table().engine_rows(kv, "vllm")[0].value
    assert vllm_command.kv_cache_dtype(recipe) == want == ("fp8" if kv == "fp8_cast" else kv)
    args = vllm_command.gpu_command(recipe, vllm.hf_checkpoint_dir(recipe))
    assert args[args.index("--kv-cache-dtype") + 1] == want
    assert kv_cache_quant_algo(recipe) is None  # no KV quantization in the export: nothing calibrated
    assert vllm.BACKEND.builder.kv_source_line(recipe).startswith(f"KV cache: {kv}, from vLLM --kv-cache-dtype {want} ")


def test_every_engine_format_is_a_recipe_value() -> None:
    assert sorted(k.value for k in ENGINE_KV_FORMATS) == sorted(VLLM_GPU_FORMATS)
    from pathlib import Path

    from trtkv.runtime.checkpoint import kv_format_for_algo  # the registry's inverse: null is none, FP8 fp8

    assert [kv_format_for_algo(a, Path("config.json")) for a in (None, "FP8", "INT8", "NVFP4")] == \
        ["none", "fp8", "int8", "nvfp4"]
    with pytest.raises(StageError, match=r"config.json: kv_cache_quant_algo 'FP4'; .* \['FP8', 'INT8', 'NVFP4'\] or none"):
        kv_format_for_algo("FP4", Path("config.json"))


@pytest.mark.parametrize(("backend", "kv", "alternative"), [
    ("tensorrt", "int8_per_token_head", "int8 on build.backend tensorrt"),
    ("llmapi", "fp8_per_token_head", "fp8 (calibrated scales)"),
    ("reference", "turboquant_k8v4", "fp8 (calibrated scales)"),
])
def test_a_backend_without_a_table_row_refuses_with_the_engine_and_an_alternative(backend: str, kv: str,
                                                                                  alternative: str) -> None:
    gpu = ["hardware.gpu=cpu", "hardware.count=1", "build.tp_size=1"] if backend == "reference" else []
    msg = _problems("llama70b_fp8kv", [f"build.backend={backend}", *gpu, f"quantization.kv_cache={kv}"])
    assert f"{kv} is served by vllm 0.32.0" in msg
    assert re.search(r"use build.backend (sglang or )?vllm", msg) and alternative in msg, msg


def test_vllm_cpu_refuses_triton_only_formats_and_serves_fp8_cast() -> None:
    msg = _problems("smollm2_fp8kv_vllm", ["quantization.kv_cache=int8_per_token_head"])
    assert "TritonAttentionBackend" in msg and "CPUAttentionBackend" in msg, msg
    recipe = load_recipe("smollm2_fp8kv_vllm", ["quantization.kv_cache=fp8_cast"])
    assert vllm_command.kv_cache_dtype(recipe) == "fp8" and recipe.kv_format.value == "fp8_scale1"


def test_llmapi_serves_fp8_cast_as_kv_cache_config_dtype_fp8() -> None:
    """Issue 51: the LLM API's FP8 cache at scale 1.0, nothing calibrated (refused as 'not by build.backend llmapi' on
    main): what `trtkv init` moves a stored checkpoint's KV to on llmapi."""
    from trtkv.backends import llmapi_args

    over = ["build.backend=llmapi", "quantization.kv_cache=fp8_cast"]
    assert _problems("llama70b_fp8kv", over) == ""
    recipe = load_recipe("llama70b_fp8kv", over)
    assert llmapi_args.kv_dtype(recipe) == "fp8" and recipe.kv_format.value == "fp8_scale1"


def test_a100_refuses_fp8_stores_but_takes_int8_per_token_head() -> None:
    a100 = [*GPU_VLLM, "hardware.gpu=A100-80GB", "quantization.weights=none"]
    assert "SM89" in _problems("llama70b_fp8kv", [*a100, "quantization.kv_cache=fp8_per_token_head"])
    assert _problems("llama70b_fp8kv", [*a100, "quantization.kv_cache=int8_per_token_head"]) == ""


def test_vllm_static_int8_points_to_int8_per_token_head() -> None:
    msg = _problems("llama70b_fp8kv", [*GPU_VLLM, "quantization.kv_cache=int8"])
    assert "int8_per_token_head" in msg and "int8 on build.backend tensorrt" in msg


def test_the_rules_read_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """Drop vLLM's int8_per_token_head row: the same recipe is now refused (validation follows the data)."""
    table = engines.load_table()
    row = table.formats["int8_per_token_head"]
    formats = {**table.formats, row.name: dataclasses.replace(row, engines=())}
    monkeypatch.setattr(engines, "load_table", lambda: dataclasses.replace(table, formats=formats))
    msg = _problems("llama70b_fp8kv", [*GPU_VLLM, "quantization.kv_cache=int8_per_token_head"])
    assert "no serving engine" in msg and "build.backend (none in trtkv)" in msg, msg


@pytest.mark.parametrize(("expr", "cap", "holds"), [
    ("True", (8, 0), True), ("inherited (AttentionBackend: no limit of its own)", (7, 5), True),
    ("capability >= DeviceCapability(8, 0)", (9, 0), True), ("capability >= DeviceCapability(8, 0)", (7, 5), False),
    ("capability.major == 10", (9, 0), False), ("capability.major in [9, 10]", (10, 0), True),
    ("capability == DeviceCapability(9, 0)", (9, 0), True),
    ("capability >= DeviceCapability(8, 0) and capability <= DeviceCapability( 12, 1 )", (10, 0), True),
    ("capability >= DeviceCapability(8, 0) and capability <= DeviceCapability( 12, 1 )", (12, 2), False),
    ("get_cdna_version() > 2", (9, 0), False),
])
def test_capability_conditions_as_the_table_records_them(expr: str, cap: tuple[int, int], holds: bool) -> None:
    assert capability_holds(expr, cap) is holds


def test_calibrate_says_there_is_nothing_to_calibrate() -> None:
    from trtkv.calibrate.common import engine_format_note
    from trtkv.calibrate.describe import describe_calibration, modelopt_config_spec

    recipe = load_recipe("llama70b_fp8kv", [*GPU_VLLM, "quantization.kv_cache=int8_per_token_head"])
    assert modelopt_config_spec(recipe)["kv_entries"] == []
    assert any("int8_per_token_head: nothing to calibrate" in line for line in describe_calibration(recipe))
    cast = engine_format_note(KVCacheQuant.FP8_CAST) or ""
    assert "no KV scales written" in cast and "scale 1.0" in cast
    assert engine_format_note(KVCacheQuant.FP8) is None
