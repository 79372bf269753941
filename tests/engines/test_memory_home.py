"""Engine memory has one home: each engine's knobs, defaults, flags, pool rule and read-back live in
its module under trtkv/engines/. The recipe declares the knobs (trtkv/recipe/triton_section.py) and
says which backend reads each (trtkv/recipe/memory_knobs.py) because validation runs below the
engines' layer (tests/test_imports.py); every other module reaches a knob or a flag through its
backend's `memory` (trtkv.backends.seam.MemoryRule) or a name the engine's module exports."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "trtkv"
HOMES = ("engines/", "recipe/triton_section.py", "recipe/memory_knobs.py")
# the recipe's memory knobs (triton.<knob>) and the engines' own names for them
KNOBS = frozenset(
    {"gpu_memory_utilization", "mem_fraction_static", "kv_cache_free_gpu_mem_fraction", "kv_pool_gib_per_gpu"}
)
FLAGS = KNOBS | {
    "--gpu-memory-utilization",  # vLLM
    "--kv-cache-memory-bytes",
    "--mem-fraction-static",  # SGLang
    "--max-total-tokens",
    "free_gpu_memory_fraction",  # TensorRT-LLM's LLM API kv_cache_config
    "kv_cache_config.free_gpu_memory_fraction",
    "kv_cache_config.max_tokens",
    "--kv_cache_free_gpu_memory_fraction",  # trtllm-serve
    "max_tokens_in_paged_kv_cache",  # the engine path's tensorrt_llm model
}


def memory_names(tree: ast.AST) -> list[str]:
    """Where code (docstrings and comments are prose, not counted) reads a memory knob (`x.<knob>`)
    or spells an engine memory flag or knob as a string."""
    docstrings = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in KNOBS:
            out.append(f"{node.lineno}: .{node.attr}")
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value in FLAGS
            and id(node) not in docstrings
        ):
            out.append(f"{node.lineno}: {node.value!r}")
    return out


def outside_homes(package: Path) -> list[str]:
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        if "templates" in path.parts or rel.startswith(HOMES):
            continue
        found += [f"trtkv/{rel}:{hit}" for hit in memory_names(ast.parse(path.read_text()))]
    return found


def test_engine_memory_knobs_and_flags_live_only_in_their_homes() -> None:
    """A new memory knob or flag belongs in its engine's module under trtkv/engines/ (the recipe
    field in triton_section.py, its readers in memory_knobs.py); a backend or stage names it through
    the engine module's exports."""
    assert outside_homes(PACKAGE) == []


def test_the_scan_sees_a_knob_read_and_a_flag_outside_a_home(tmp_path: Path) -> None:
    (tmp_path / "backends").mkdir()
    (tmp_path / "backends" / "new_engine.py").write_text(
        '"""Uses --gpu-memory-utilization in prose only."""\n'
        "def command(recipe):\n"
        "    # --mem-fraction-static in a comment is prose too\n"
        '    return ["--max-total-tokens", str(recipe.triton.kv_pool_gib_per_gpu)]\n'
    )
    (tmp_path / "engines").mkdir()
    (tmp_path / "engines" / "new_engine.py").write_text('FLAG = "--mem-fraction-static"\n')
    assert outside_homes(tmp_path) == [
        "trtkv/backends/new_engine.py:4: '--max-total-tokens'",
        "trtkv/backends/new_engine.py:4: .kv_pool_gib_per_gpu",
    ]


def rule_outside_engines(backends: dict) -> list[str]:
    """Each backend's memory parts that are not the engine's own rule object (a function of a module
    under trtkv/engines/): a name a registry would look up, or a rule defined elsewhere."""
    out = []
    for backend, obj in backends.items():
        mem = obj.memory
        if mem is None:
            out.append(f"{backend.value}: no memory rule")
            continue
        parts = {"pool": mem.pool, "knobs": mem.knobs, "cpu_pool": mem.cpu_pool,
                 "batch_limit": mem.batch_limit, "tokens": mem.tokens}
        for name, part in parts.items():
            if part is None and name not in ("pool", "knobs"):
                continue  # an optional part the engine has none of
            module = getattr(part, "__module__", None) or ""
            if not callable(part) or not module.startswith("trtkv.engines."):
                out.append(f"{backend.value}: memory.{name} is {part!r}")
    return out


def test_each_backend_holds_its_engines_rule_objects() -> None:
    """The backend object names its own rule: MemoryRule holds the engine module's functions (the
    planner calls what it holds), no string looked up in a table of rules."""
    from trtkv.backends import BACKENDS

    assert rule_outside_engines(BACKENDS) == []


def test_the_rule_check_sees_a_rule_by_name_and_one_defined_outside_engines() -> None:
    from dataclasses import replace

    from trtkv.backends import BACKENDS
    from trtkv.recipe import Backend

    vllm = BACKENDS[Backend.VLLM]
    by_name = replace(vllm, memory=replace(vllm.memory, pool="vllm_recipe_pool"))
    local = replace(vllm, memory=replace(vllm.memory, knobs=lambda recipe: vllm.memory.knobs(recipe)))
    assert rule_outside_engines({Backend.VLLM: by_name}) == ["vllm: memory.pool is 'vllm_recipe_pool'"]
    (hit,) = rule_outside_engines({Backend.VLLM: local})
    assert hit.startswith("vllm: memory.knobs is <function ")
