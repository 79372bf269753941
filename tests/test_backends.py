"""The backend seam: one object per recipe build.backend (trtkv.backends), their recipe rules registered, and no
backend branches left in the stages."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trtkv.backends import BACKENDS, for_recipe
from trtkv.errors import RecipeError
from trtkv.recipe import BACKEND_RULES, Backend, load_recipe

PACKAGE = Path(__file__).resolve().parents[1] / "trtkv"


def test_every_backend_has_its_object_and_rules() -> None:
    assert set(BACKENDS) == set(Backend) == set(BACKEND_RULES)
    for backend, obj in BACKENDS.items():
        assert obj.backend is backend and BACKEND_RULES[backend] == obj.problems
    assert for_recipe(load_recipe("llama8b_fp8kv")).llm_step_model == "tensorrt_llm_stream"
    assert for_recipe(load_recipe("smollm2_fp8kv")).serves_locally(load_recipe("smollm2_fp8kv"))
    cpu, gpu = load_recipe("smollm2_fp8kv_llmapi"), load_recipe("llama70b_fp8kv_llmapi")
    assert for_recipe(cpu) is for_recipe(gpu) and for_recipe(cpu).serves_locally(cpu)
    assert not for_recipe(gpu).serves_locally(gpu)
    assert (for_recipe(cpu).llm_module(cpu), for_recipe(gpu).llm_module(gpu)) == ("trtkv.runtime.llm", "tensorrt_llm")


def test_no_backend_branches_outside_the_backends_package() -> None:
    """`if backend is Backend.X` lives in trtkv/backends/ only (the recipe field's default is the one other use)."""
    pattern = re.compile(r"Backend\.(TENSORRT|LLMAPI|REFERENCE)")
    found = []
    for path in PACKAGE.rglob("*.py"):
        if "backends" in path.relative_to(PACKAGE).parts or "templates" in path.parts:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line) and "Field(Backend.TENSORRT" not in line and line.strip() != "Backend.TENSORRT,":
                found.append(f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}")
    assert found == []


@pytest.mark.parametrize("recipe, overrides, message", [
    ("llama8b_fp8kv", ["hardware.gpu=cpu", "build.tp_size=1"], "backend tensorrt needs a GPU"),
    ("llama8b_fp8kv_pytorch", ["quantization.kv_cache=int8"], r"quantization.kv_cache: INT8 KV needs the engine path "
                                                               r"\(TensorRT-LLM <= 1.2.x"),
    ("llama70b_fp8kv_llmapi", ["quantization.kv_cache=int8"], "INT8 KV needs the engine path"),
    ("llama70b_nvfp4kv", ["hardware.gpu=H100-80GB"], r"quantization.kv_cache: an NVFP4 KV cache needs a Blackwell GPU"),
    ("llama70b_nvfp4kv", ["build.backend=tensorrt"], "NVFP4 KV cache is served by TensorRT-LLM's LLM API"),
    ("smollm2_fp8kv_llmapi", ["quantization.kv_cache=nvfp4"], "needs a Blackwell GPU"),
    ("smollm2_fp8kv_llmapi", ["quantization.weights=int4_awq"], "the reference runtime runs fp8 or none weights"),
    ("smollm2_fp8kv", ["quantization.weights=int4_awq"], "the reference runtime runs fp8 or none weights"),
    ("llama70b_fp8kv", ["hardware.gpu=B200", "quantization.kv_cache=int8"], "refuses an INT8 KV cache on B200"),
])
def test_each_backends_rules_reach_validation(recipe: str, overrides: list[str], message: str) -> None:
    with pytest.raises(RecipeError, match=message):
        load_recipe(recipe, overrides)
