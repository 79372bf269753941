"""The backend seam: one object per recipe build.backend (trtkv.backends), rules for each in the model layer, and no
backend branches left in the stages."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trtkv.backends import BACKENDS, for_recipe
from trtkv.core.errors import RecipeError
from trtkv.recipe import BACKEND_RULES, Backend, load_recipe

PACKAGE = Path(__file__).resolve().parents[2] / "trtkv"


def test_every_backend_has_its_object_and_rules() -> None:
    assert set(BACKENDS) == set(Backend) == set(BACKEND_RULES)
    for backend, obj in BACKENDS.items():
        assert obj.backend is backend
    assert for_recipe(load_recipe("llama8b_fp8kv")).llm_step_model == "tensorrt_llm_stream"
    assert for_recipe(load_recipe("smollm2_fp8kv")).serves_locally(load_recipe("smollm2_fp8kv"))
    cpu, gpu = load_recipe("smollm2_fp8kv_llmapi"), load_recipe("llama70b_fp8kv_llmapi")
    assert for_recipe(cpu) is for_recipe(gpu) and for_recipe(cpu).serves_locally(cpu)
    assert not for_recipe(gpu).serves_locally(gpu)
    assert (for_recipe(cpu).llm_module(cpu), for_recipe(gpu).llm_module(gpu)) == ("trtkv.runtime.llm", "tensorrt_llm")


def test_no_backend_branches_outside_the_backends_package() -> None:
    """`if backend is Backend.X` lives in trtkv/backends/ and in each backend's recipe rules
    (trtkv/recipe/backend_rules.py) only (the recipe field's default is the one other use; a name interpolated into
    help text, `{Backend.X.value}`, is no branch)."""
    pattern = re.compile(r"Backend\.(TENSORRT|LLMAPI|REFERENCE|VLLM)(?!\.value\})")
    found = []
    for path in PACKAGE.rglob("*.py"):
        if ("backends" in path.relative_to(PACKAGE).parts or "templates" in path.parts
                or path == PACKAGE / "recipe" / "backend_rules.py"):
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


def test_vllm_cpu_fp8_kv_is_refused_before_loading_on_a_cpu_without_avx512_or_amx(
        tmp_path: Path, engines_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """vllm-cpu 0.32 keeps an FP8 KV cache only on x86 with AVX-512 or AMX and says so only after minutes of
    loading; `trtkv serve` says it first, with the CPU and the way out."""
    from trtkv.backends import vllm
    from trtkv.core.errors import StageError
    from trtkv.serving import serve

    def cpuinfo(name: str, flags: str) -> Path:
        path = tmp_path / name
        path.write_text(f"processor\t: 0\nmodel name\t: {name}\nflags\t\t: {flags}\n\n"
                        f"processor\t: 1\nmodel name\t: other\nflags\t\t: avx512f\n")
        return path

    avx2 = vllm.cpu_flags(cpuinfo("AMD EPYC", "fpu sse2 avx avx2 fma"))
    assert avx2 == ("AMD EPYC", {"fpu", "sse2", "avx", "avx2", "fma"})  # the first CPU's line, not the second's
    recipe = load_recipe("smollm2_fp8kv_vllm")
    problem = vllm.cpu_fp8_kv_problem(recipe, avx2)
    assert problem and "AMD EPYC" in problem and "quantization.kv_cache is fp8" in problem
    assert "quantization.kv_cache=none" in problem
    assert vllm.cpu_fp8_kv_problem(recipe, vllm.cpu_flags(cpuinfo("Xeon", "avx2 avx512f avx512bw"))) is None
    assert vllm.cpu_fp8_kv_problem(recipe, vllm.cpu_flags(cpuinfo("Xeon AMX", "avx2 amx_tile amx_bf16"))) is None
    assert vllm.cpu_fp8_kv_problem(load_recipe("smollm2_fp8kv_vllm", ["quantization.kv_cache=none"]), avx2) is None
    monkeypatch.setattr(vllm, "cpu_flags", lambda *a: avx2)
    with pytest.raises(StageError, match="AVX-512 or AMX"):  # before asking for the checkpoint this folder lacks
        serve.start(recipe)
    lines: list[str] = []
    serve.start(recipe, dry_run=True, log=lines.append)
    assert "will be refused here" in lines[-1]
