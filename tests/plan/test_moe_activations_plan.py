"""The plan prices MXFP4 experts with the activations the engine runs (build.moe_activations, trtkv.recipe.
moe_activations): the MXFP8 rows of aiconfigurator-core's kernel tables where the engine runs MXFP8 (TensorRT-LLM and
SGLang by themselves on Blackwell, vLLM when asked), BF16 rows otherwise; aiconfigurator is asked for the same rows; a
model whose experts are not MXFP4 refuses the choice."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.support import speed_cases as sc
from trtkv.core.errors import RecipeError
from trtkv.plan.aic import request
from trtkv.plan.estimate import model_shape
from trtkv.plan.model import resolve_architecture
from trtkv.plan.moe_step import routed_ms, routing_note
from trtkv.plan.planner import plan
from trtkv.plan.speed import kernels_for
from trtkv.recipe import SPEED_ENGINE

GPT_OSS, DEEPSEEK = "tests/data/configs/gpt_oss_120b", "tests/data/configs/deepseek_v3"


def gpt_oss(backend: str, value: str, gpu: str = "B200"):  # noqa: ANN201 - a Recipe
    return sc.recipe_for(GPT_OSS, gpu, backend, "bf16", 1024, 1024, [64], 8192, moe_activations=value)


def expert_ms(recipe) -> tuple[float, float]:  # noqa: ANN001 - a Recipe
    """(priced as the recipe runs them, priced from the BF16-activation rows) of one 64-token decode step's experts."""
    arch = resolve_architecture(recipe)
    moe = model_shape(arch, recipe).moe
    assert moe is not None and moe.table == "w4a16_mxfp4"
    k = kernels_for(recipe.hardware.gpu, SPEED_ENGINE[recipe.build.backend])
    return routed_ms(k, moe, 64)[0], routed_ms(k, replace(moe, activations="bf16"), 64)[0]


@pytest.mark.parametrize(("backend", "value", "mxfp8"), [
    ("vllm", "auto", False), ("vllm", "bf16", False), ("vllm", "mxfp8", True), ("sglang", "auto", True),
    ("sglang", "bf16", False), ("llmapi", "auto", True)])
def test_experts_priced_from_the_rows_the_engine_runs(backend: str, value: str, mxfp8: bool) -> None:
    recipe = gpt_oss(backend, value)
    got, bf16 = expert_ms(recipe)
    k = kernels_for(recipe.hardware.gpu, SPEED_ENGINE[recipe.build.backend])
    moe = model_shape(resolve_architecture(recipe), recipe).moe
    assert moe is not None
    mx = routed_ms(k, replace(moe, table="w4a8_mxfp4_mxfp8", activations="bf16"), 64)[0]
    assert mx != bf16  # the two rows differ at this shape, so the choice shows
    assert got == (mx if mxfp8 else bf16)
    req = request(recipe, resolve_architecture(recipe), ["fp8"], [64], GPT_OSS)
    assert req.get("moe_quant_mode") == ("w4a8_mxfp4_mxfp8" if mxfp8 else None)


def test_hopper_runs_bf16_whatever_the_engine() -> None:
    for backend in ("vllm", "sglang", "llmapi"):
        recipe = gpt_oss(backend, "auto", "H200-141GB")
        got, bf16 = expert_ms(recipe)
        assert got == bf16
        assert "moe_quant_mode" not in request(recipe, resolve_architecture(recipe), ["fp8"], [64], GPT_OSS)


def test_the_routing_note_says_what_was_priced() -> None:
    for value, words in (("auto", "MXFP4 experts with BF16 activations (vLLM's own choice on this GPU"),
                         ("mxfp8", "MXFP4 experts with MXFP8 activations (build.moe_activations mxfp8, on vLLM)")):
        recipe = gpt_oss("vllm", value)
        note = routing_note(resolve_architecture(recipe), recipe, [1, 64])
        assert note is not None and words in note


def test_experts_not_mxfp4_refuse_the_choice() -> None:
    recipe = sc.recipe_for(DEEPSEEK, "B200", "vllm", "bf16", 1024, 1024, [64], 8192, tp=8,
                           moe_activations="mxfp8")
    with pytest.raises(RecipeError) as err:
        plan(recipe)
    text = str(err.value)
    assert "build.moe_activations mxfp8: it applies to MXFP4 experts" in text and "fp8_block" in text
    assert "Next: set build.moe_activations auto" in text
    plan(sc.recipe_for(DEEPSEEK, "B200", "vllm", "bf16", 1024, 1024, [64], 8192, tp=8))  # auto plans


@pytest.mark.parametrize(("backend", "gpu", "other"), [
    ("vllm", "B200", "mxfp8"), ("sglang", "B200", "bf16"), ("llmapi", "B200", None), ("vllm", "H200-141GB", None)])
def test_the_estimate_says_what_the_other_activation_would_price(backend: str, gpu: str, other: str | None) -> None:
    from trtkv.plan.estimate import estimate

    recipe = sc.recipe_for(GPT_OSS, gpu, backend, "fp8", 1024, 1024, [1, 64], 8192)
    said = [n for n in estimate(recipe, plan(recipe), use_aiconfigurator=False).notes
            if n.startswith("build.moe_activations")]
    if other is None:  # one activation on this engine and GPU: nothing to compare
        assert not said
        return
    alt = sc.own_rows(sc.recipe_for(GPT_OSS, gpu, backend, "fp8", 1024, 1024, [1, 64], 8192, moe_activations=other))
    own = sc.own_rows(recipe)
    (note,) = said
    assert note.startswith(f"build.moe_activations {other} (trtkv's model on both sides")
    for c in (1, 64):
        o, a = own[(recipe.kv_format_label, c)].itl_ms, alt[(recipe.kv_format_label, c)].itl_ms
        assert f"{o:.2f} -> {a:.2f} ms" in note
