"""A pre-quantized checkpoint (model.checkpoint_quant): its weights used as stored, never quantized again into a format
as large or larger, and no calibrated KV cache where the engine reads no KV scale beside them; `trtkv init` records
the stored format, keeps the weights as stored and moves a refused default KV format to fp8_cast with a warning."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtkv.cli.init import write_recipe
from trtkv.core.errors import RecipeError
from trtkv.plan.planner import plan
from trtkv.recipe import load_recipe
from trtkv.recipe.stored import stored_problems

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"
GIB = 1024**3


def gpt_oss(tmp_path: Path, *overrides: str, backend: str = "vllm"):  # noqa: ANN201 - a Recipe
    out = tmp_path / f"g_{backend}.yaml"
    if not out.exists():
        write_recipe(f"g_{backend}", CONFIGS / "gpt_oss_120b", out, "H200-141GB", backend=backend,
                     warn=lambda _line: None)
    return load_recipe(out, list(overrides))


def test_init_keeps_the_mxfp4_weights_as_stored_and_moves_kv_to_fp8_cast_with_a_warning(tmp_path: Path) -> None:
    """Issue 51: on main `init --model gpt_oss_120b --gpu H200-141GB --backend vllm` wrote fp8 weights (109.85 GiB, a
    17.34 GiB pool, 24 sequences); as stored with fp8_cast it is what main's `--kv-cache fp8_cast` gives: 60.69 GiB of
    weights, a 66.32 GiB KV pool and 93 sequences (the issue's 66.86 / 94 predate the engine memory rule of #50)."""
    warned: list[str] = []
    out = write_recipe("g", CONFIGS / "gpt_oss_120b", tmp_path / "g.yaml", "H200-141GB", backend="vllm",
                       warn=warned.append)
    recipe = load_recipe(out)
    assert recipe.model.checkpoint_quant == "mxfp4" and recipe.quantization.weights.value == "none"
    assert recipe.quantization.kv_cache.value == "fp8_cast"
    assert len(warned) == 1 and "quantization.kv_cache: fp8_cast, not fp8" in warned[0] and "Mxfp4Config" in warned[0]
    assert "kv_cache: fp8_cast   # fp8_cast, not fp8" in out.read_text()
    p = plan(recipe)
    cap = next(c for c in p.formats if c.format == p.recipe_kv_format)
    print(f"weights {p.weights.per_gpu_gib:.2f} GiB, KV pool {p.kv_budget_gib_per_gpu:.2f} GiB, "
          f"{cap.max_sequences[recipe.build.max_seq_len]} sequences, batch {recipe.build.max_batch_size}")
    # issue 51's figures at a cap of 93 (what init wrote before #52 sized the cap for the bench workload)
    at93 = plan(recipe.model_copy(update={"build": recipe.build.model_copy(update={"max_batch_size": 93})}))
    assert round(at93.weights.per_gpu_gib, 2) == 60.69 and round(at93.kv_budget_gib_per_gpu, 2) == 66.32
    assert next(c for c in at93.formats if c.format == p.recipe_kv_format).max_sequences[recipe.build.max_seq_len] == 93
    # #52: the cap is the workload's sequences that fit beside the activation the cap itself costs
    assert round(p.weights.per_gpu_gib, 2) == 60.69
    c = p.concurrency
    assert cap.max_sequences[recipe.build.max_seq_len] == c.full_context_sequences < recipe.build.max_batch_size
    assert recipe.build.max_batch_size == c.cap <= min(c.workload_sequences, 1024)


def test_a_kv_cache_asked_for_is_refused_with_fp8_cast_among_the_alternatives(tmp_path: Path) -> None:
    with pytest.raises(RecipeError) as err:
        write_recipe("g", CONFIGS / "gpt_oss_120b", tmp_path / "g.yaml", "H200-141GB", backend="vllm", kv_cache="fp8")
    text = str(err.value)
    assert "quantization.kv_cache (from --kv-cache fp8)" in text and "Mxfp4Config" in text
    assert "kv_cache fp8_cast" in text and "kv_cache none" in text and "another build.backend" in text
    assert not (tmp_path / "g.yaml").exists()


def test_weights_none_is_accepted_and_a_larger_format_refused(tmp_path: Path) -> None:
    recipe = gpt_oss(tmp_path)
    assert stored_problems(recipe) == [] and recipe.quantization.weights.value == "none"
    with pytest.raises(RecipeError) as err:
        gpt_oss(tmp_path, "quantization.weights=fp8")
    text = str(err.value)
    assert "quantization.weights: fp8 on a checkpoint stored as mxfp4 (4-bit" in text and "never quantizes" in text
    assert "Use quantization.weights none" in text
    with pytest.raises(RecipeError, match=r"quantization.weights \(from --weights fp8\).*stored as mxfp4"):
        write_recipe("w", CONFIGS / "gpt_oss_120b", tmp_path / "w.yaml", "H200-141GB", backend="vllm", weights="fp8")


def test_only_a_smaller_known_format_may_requantize(tmp_path: Path) -> None:
    base = gpt_oss(tmp_path, backend="llmapi")
    assert base.quantization.kv_cache.value == "fp8_cast"  # TensorRT-LLM reads no FP8 KV scale: moved
    smaller = load_recipe(base.path, ["model.checkpoint_quant=fp8", "quantization.weights=int4_awq"])
    assert stored_problems(smaller) == []
    with pytest.raises(RecipeError, match=r"fp8 on a checkpoint stored as fp8 \(8-bit"):
        load_recipe(base.path, ["model.checkpoint_quant=fp8", "quantization.weights=fp8"])
    with pytest.raises(RecipeError, match=r"int4_awq on a checkpoint stored as bitnet \(of unknown size"):
        load_recipe(base.path, ["model.checkpoint_quant=bitnet", "quantization.weights=int4_awq"])


def test_llmapi_init_moves_a_stored_checkpoints_kv_to_fp8_cast_with_a_warning(tmp_path: Path) -> None:
    """Issue 51: on main init kept kv_cache fp8 on llmapi (the default GPU backend) for a stored checkpoint; plan
    priced it as fp8_cast, then calibrate refused it (TensorRT-LLM reads no KV scale beside stored weights), so the
    default chain stopped there."""
    warned: list[str] = []
    out = write_recipe("t", CONFIGS / "gpt_oss_120b", tmp_path / "t.yaml", "H200-141GB", backend="llmapi",
                       warn=warned.append)
    recipe = load_recipe(out)
    assert (recipe.quantization.weights.value, recipe.quantization.kv_cache.value) == ("none", "fp8_cast")
    assert len(warned) == 1 and "quantization.kv_cache: fp8_cast, not fp8" in warned[0], warned
    assert "tensorrt_llm" in warned[0] and "scale 1.0" in warned[0]
    p = plan(recipe)
    assert p.recipe_kv_format == "fp8_scale1" and round(p.weights.per_gpu_gib, 2) == 60.69


def test_llmapi_refuses_a_calibrated_fp8_kv_on_stored_weights_naming_the_alternatives(tmp_path: Path) -> None:
    with pytest.raises(RecipeError) as err:
        write_recipe("t", CONFIGS / "gpt_oss_120b", tmp_path / "t.yaml", "H200-141GB", backend="llmapi",
                     kv_cache="fp8")
    text = str(err.value)
    assert "quantization.kv_cache (from --kv-cache fp8)" in text and "scale 1.0" in text
    # MXFP4: vLLM gives its attention no KV method either, so it is not offered
    assert "kv_cache fp8_cast" in text and "kv_cache none" in text and "another build.backend" in text
    base = gpt_oss(tmp_path, backend="llmapi")
    for stored in ("nvfp4", "fp8"):  # weights calibrate runs on: vLLM reads the scales beside them
        with pytest.raises(RecipeError, match=f"stored as {stored} with build.backend llmapi") as err:
            load_recipe(base.path, [f"model.checkpoint_quant={stored}", "quantization.kv_cache=fp8"])
        assert "kv_cache fp8_cast" in str(err.value) and "or build.backend vllm (vLLM reads" in str(err.value)
    # fp8_cast and 16-bit KV on the stored weights are served by llmapi
    for kv in ("fp8_cast", "none"):
        assert stored_problems(load_recipe(base.path, ["model.checkpoint_quant=nvfp4",
                                                       f"quantization.kv_cache={kv}"])) == []


def test_a_16bit_checkpoint_on_llmapi_keeps_its_calibrated_fp8_kv(tmp_path: Path) -> None:
    warned: list[str] = []
    out = write_recipe("l", CONFIGS / "llama3_1_8b", tmp_path / "l.yaml", backend="llmapi", warn=warned.append)
    recipe = load_recipe(out)
    assert recipe.quantization.kv_cache.value == "fp8" and recipe.model.checkpoint_quant is None and warned == []


def test_the_stored_format_is_a_word(tmp_path: Path) -> None:
    base = gpt_oss(tmp_path)
    with pytest.raises(RecipeError, match="model.checkpoint_quant"):
        load_recipe(base.path, ["model.checkpoint_quant=a b"])


def test_a_16bit_checkpoint_on_vllm_keeps_none_weights_with_fp8_kv(tmp_path: Path) -> None:
    """On main init moved weights none to fp8 for vLLM (its ModelOpt loader refuses a KV-only export); calibrate now
    writes the compressed-tensors KV-only form vLLM reads (tests/calibrate/test_kv_only_vllm.py)."""
    warned: list[str] = []
    out = write_recipe("v", CONFIGS / "llama3_1_8b", tmp_path / "v.yaml", backend="vllm", warn=warned.append)
    recipe = load_recipe(out)
    assert (recipe.quantization.weights.value, recipe.quantization.kv_cache.value) == ("none", "fp8")
    assert recipe.model.checkpoint_quant is None and warned == []
