"""build.moe_activations: each engine's own pick for gpt-oss-120b's MXFP4 experts on Hopper and Blackwell, and
the refusals where the engine would fall back or has no switch (trtkv.recipe.moe_activations), on recipes `trtkv init`
writes from tests/data/configs/gpt_oss_120b."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtkv.core.errors import RecipeError
from trtkv.recipe import load_recipe, moe_activations_text, resolved_moe_activations

CONFIG = Path(__file__).resolve().parents[1] / "data" / "configs" / "gpt_oss_120b"


def recipe(tmp_path: Path, backend: str, gpu: str, value: str):  # noqa: ANN201 - a Recipe
    from trtkv.cli.init import write_recipe

    name = f"gptoss_{backend}_{gpu}".lower().replace("-", "_")
    path = tmp_path / f"{name}.yaml"
    if not path.exists():
        write_recipe(name, CONFIG, path, gpu, count=1, backend=backend)
    return load_recipe(path, [f"build.moe_activations={value}"])


@pytest.mark.parametrize(("backend", "gpu", "own"), [
    ("llmapi", "B200", "mxfp8"), ("llmapi", "H200-141GB", "bf16"), ("vllm", "B200", "bf16"),
    ("vllm", "H200-141GB", "bf16"), ("sglang", "B200", "mxfp8"), ("sglang", "RTX-PRO-6000", "mxfp8"),
    ("sglang", "H200-141GB", "bf16")])
def test_auto_is_the_engines_own_pick(tmp_path: Path, backend: str, gpu: str, own: str) -> None:
    r = recipe(tmp_path, backend, gpu, "auto")
    assert resolved_moe_activations(r) == own
    assert f"with {own.upper()} activations" in moe_activations_text(r) and "own choice" in moe_activations_text(r)
    assert resolved_moe_activations(recipe(tmp_path, backend, gpu, own)) == own  # its own pick, asked for


@pytest.mark.parametrize(("backend", "gpu", "value", "words"), [
    ("llmapi", "B200", "bf16", "TensorRT-LLM on B200 runs MXFP4 experts with mxfp8 activations only"),
    ("llmapi", "H200-141GB", "mxfp8", "need FP4 tensor cores"),
    ("vllm", "H200-141GB", "mxfp8", "on H200-141GB vLLM runs BF16 activations"),
    ("sglang", "RTX-PRO-6000", "bf16", "SGLang on RTX-PRO-6000 runs MXFP4 experts with mxfp8 activations only")])
def test_refused_where_the_engine_would_not_run_it(tmp_path: Path, backend: str, gpu: str, value: str,
                                                   words: str) -> None:
    with pytest.raises(RecipeError) as err:
        recipe(tmp_path, backend, gpu, value)
    text = str(err.value)
    assert "build.moe_activations" in text and words in text and "Allowed here: auto" in text


@pytest.mark.parametrize(("backend", "value"), [("vllm", "mxfp8"), ("sglang", "bf16")])
def test_the_switches_engines_have(tmp_path: Path, backend: str, value: str) -> None:
    r = recipe(tmp_path, backend, "B200", value)
    assert resolved_moe_activations(r) == value
    assert f"build.moe_activations {value}" in moe_activations_text(r)
