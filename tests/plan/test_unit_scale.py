"""Issue 51: where the engine runs an FP8 KV cache at scale 1.0 whatever k/v scales the checkpoint holds -- TensorRT-LLM's
PyTorch backend (LLM API: trtllm-serve, Triton llmapi), whose attention keeps kv_cache_scaling_factor = 1.0 and hands
the qkv_proj's k/v scales to attention only for an FP4 KV cache, and vLLM's MXFP4 config (gpt-oss), which gives
attention no KV method -- `trtkv plan` says the engine will use 1.0 and prices the cache as fp8_cast (the registry's
fp8_scale1 row); the KV-format registry, the scale audit and the reference runtime give that one answer."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtkv.cli.init import write_recipe
from trtkv.engines.kv_scale_loaders import engine_scales
from trtkv.kvcache.engines import load_table
from trtkv.kvcache.formats import KVFormat
from trtkv.measures.probe_results import recipe_probe_format
from trtkv.plan.model import kv_format_for_recipe
from trtkv.plan.planner import plan
from trtkv.recipe import load_recipe
from trtkv.recipe.stored import engine_unit_scale
from trtkv.runtime.hf_checkpoint import KV_ALGOS

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"
WILL_USE_ONE = "the engine will use K/V scale 1.0 on every layer"


def test_the_registry_and_the_scale_audit_give_one_answer_per_engine() -> None:
    """On main kv_formats.json said TensorRT-LLM's PyTorch backend reads the checkpoint's FP8 KV scales ('read; one
    shared K/V scale per layer') while kv_scale_loaders.json (and runtime/hf_checkpoint.py) said 1.0."""
    fp8 = load_table().formats["fp8"]
    checked = 0
    for audit in engine_scales():
        if audit.reads != "hf" or "FP8" not in audit.kv_algos:
            continue
        rows = [e for e in fp8.engines if e.engine == audit.engine and e.value.startswith("fp8")]
        assert rows, audit.engine
        for e in rows:
            reads = not e.checkpoint_scales.startswith("not read")
            assert reads == (audit.pair("positive", "positive", "absent").uses != "unity"), (audit.engine, e)
            checked += 1
    assert checked >= 4  # vLLM (fp8, fp8_e4m3), TensorRT-LLM's PyTorch backend, SGLang
    trtllm = next(e for e in fp8.engines if e.engine == "tensorrt_llm")
    assert trtllm.checkpoint_scales.startswith("not read") and "NVFP4" in trtllm.checkpoint_scales
    assert "attention_backend/trtllm.py" in trtllm.source_file and "has_fp4_kv_cache" in trtllm.source_file
    # the reference LLM API runtime runs the export's FP8 KV as fp8_scale1 (trtkv.runtime.engine)
    assert "FP8" in KV_ALGOS


def test_plan_says_the_llm_api_runs_fp8_kv_at_one_and_prices_it_as_fp8_cast() -> None:
    recipe = load_recipe("llama8b_fp8kv_pytorch")
    assert recipe.build.backend.value == "llmapi" and recipe.quantization.kv_cache.value == "fp8"
    why = engine_unit_scale(recipe)
    assert why and "tensorrt_llm" in why and "not read" in why
    assert kv_format_for_recipe(recipe) is KVFormat.FP8_SCALE1
    assert recipe_probe_format(recipe) == "fp8_cast"
    p = plan(recipe)
    note = next(n for n in p.notes if WILL_USE_ONE in n)
    assert "Planned as fp8_cast (fp8_scale1: 8-bit, 0 dequantization operations" in note
    assert "--formats fp8,fp8_cast" in note
    # one row under the recipe's name (priced as fp8_scale1, the same bytes as calibrated fp8), no duplicate
    assert [c.format for c in p.formats].count("fp8") == 1 and p.recipe_kv_format == "fp8"


@pytest.mark.parametrize(("recipe_name", "overrides"), [
    ("llama8b_fp8kv_pytorch", ["quantization.kv_cache=none"]),
    ("llama8b_fp8kv_pytorch", ["build.backend=vllm"]),  # vLLM reads the scales
])
def test_no_note_where_the_engine_reads_the_scales_or_none_are_asked_for(recipe_name: str,
                                                                        overrides: list[str]) -> None:
    recipe = load_recipe(recipe_name, overrides)
    assert engine_unit_scale(recipe) is None
    assert kv_format_for_recipe(recipe) is recipe.kv_format
    assert not any(WILL_USE_ONE in n for n in plan(recipe).notes)


def _gpt_oss(tmp_path: Path, backend: str):  # noqa: ANN202 - a Recipe
    out = write_recipe(f"g_{backend}", CONFIGS / "gpt_oss_120b", tmp_path / f"g_{backend}.yaml", "H200-141GB",
                       backend=backend, warn=lambda _line: None)
    return load_recipe(out)


def test_gpt_oss_on_vllm_plans_fp8_cast_and_says_why_the_engine_uses_one(tmp_path: Path) -> None:
    """init moves gpt-oss on vLLM to fp8_cast (tests/recipe/test_stored.py); the plan now says why the engine runs
    1.0: vLLM's Mxfp4Config gives the attention layers no KV method."""
    recipe = _gpt_oss(tmp_path, "vllm")
    assert recipe.model.checkpoint_quant == "mxfp4" and recipe.quantization.kv_cache.value == "fp8_cast"
    note = next(n for n in plan(recipe).notes if WILL_USE_ONE in n)
    assert "Mxfp4Config" in note and "Planned as fp8_cast" in note


def test_gpt_oss_on_the_llm_api_moves_to_fp8_cast_and_is_planned_at_one(tmp_path: Path) -> None:
    """On main init kept fp8 (planned at 1.0, then refused by calibrate); now init moves it to fp8_cast as for vLLM
    (tests/recipe/test_stored.py), the same cache the plan priced."""
    recipe = _gpt_oss(tmp_path, "llmapi")
    assert recipe.quantization.kv_cache.value == "fp8_cast"
    assert kv_format_for_recipe(recipe) is KVFormat.FP8_SCALE1 and plan(recipe).recipe_kv_format == "fp8_scale1"
