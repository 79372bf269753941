"""Adding an engine touches its own modules and two shared tables (BACKEND_ROWS in trtkv/recipe/backend_rules.py, its
rows in trtkv/data/kv_formats.json): no other table keyed by engine. A dict, set, tuple or list literal whose keys or
items are all engine names (a build.backend value, a `Backend` member, the engine names the backend rows give to
aiconfigurator, the KV-format registry and the scale audit), or a comparison with one, found outside the engines'
homes fails here. A column of the rows is the one source of what it says (the token log-probs test below)."""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

import pytest

from trtkv.backends import BACKENDS
from trtkv.recipe import Backend, load_recipe
from trtkv.recipe.backend_rules import BACKEND_ROWS

PACKAGE = Path(__file__).resolve().parents[2] / "trtkv"
# The engines' homes: the backend objects, the engines' memory and scale modules, the backend rows (one of the two
# shared tables) and the memory knobs' readers (a recipe knob is validated without importing an engine:
# docs/architecture.md, "How to add a backend")
HOMES = ("backends/", "engines/", "recipe/backend_rules.py", "recipe/memory_knobs.py")
# The recipe rules a backend has in the model layer (validation imports no backend): a comparison with one backend
# there is that backend's rule; an engine-keyed table is not
RULE_MODULES = ("recipe/engine_formats.py", "recipe/prefix_cache.py", "recipe/parallel.py", "recipe/kv_tiers.py")


def engine_names() -> set[str]:
    out = {b.value for b in Backend}
    for row in BACKEND_ROWS.values():
        out |= {row.scale_loader, row.scale_use.name}
        out |= {row.table_engine[0]} if row.table_engine else set()
        out |= {row.speed_engine.name} if row.speed_engine else set()
    return out


def _is_engine(node: ast.AST, names: set[str]) -> bool:
    """An engine's name: a string of `names`, `Backend.X` or `Backend.X.value`."""
    if isinstance(node, ast.Attribute) and node.attr == "value":
        node = node.value
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Backend":
        return True
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names


def engine_tables(source: str, where: str = "<snippet>", rules: bool = False) -> list[tuple[str, str]]:
    """(where:line, code) of each engine-keyed literal in `source`, and of each comparison with an engine name unless
    `rules` (a recipe rule module)."""
    names, out = engine_names(), []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Dict):
            keys = [k for k in node.keys if k is not None]
            keyed = bool(keys) and all(_is_engine(k, names) for k in keys)
        elif isinstance(node, (ast.Set, ast.Tuple, ast.List)):
            keyed = bool(node.elts) and all(_is_engine(e, names) for e in node.elts)
        elif isinstance(node, ast.Compare) and not rules:
            keyed = any(_is_engine(o, names) for o in [node.left, *node.comparators])
        else:
            keyed = False
        if keyed:
            out.append((f"{where}:{node.lineno}", ast.unparse(node)))
    return out


def test_no_engine_keyed_table_outside_the_engines_homes() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith(HOMES) or "templates" in path.parts:
            continue
        tables = engine_tables(path.read_text(), rel, rules=rel in RULE_MODULES)
        found += [f"{where}: {code[:100]}" for where, code in tables]
    assert found == [], "engine-keyed tables outside the engines' homes (fold them into BACKEND_ROWS / the backend):\n" \
        + "\n".join(found)


# The tables this check was written against, each folded into the backend rows or objects: each must be caught.
FOLDED = [
    "WIDE_EP_BACKENDS = (Backend.VLLM, Backend.SGLANG, Backend.LLMAPI)",  # recipe/parallel.py
    "DENSE_DP_IS_REPLICAS = (Backend.VLLM,)",  # recipe/parallel.py
    "ENGINE_RULES = {'vllm': vllm_at, 'sglang': sglang_at, 'trtllm': trtllm_at, 'tensorrt': trt_engine_at}",
    "ENGINE_LABELS = {'trtllm': 'TensorRT-LLM', 'vllm': 'vLLM', 'sglang': 'SGLang'}",  # plan/estimate.py
    "served = {'trtllm': recipe.build.tensorrt_llm_version, 'vllm': VLLM_VERSION}.get(engine)",  # plan/estimate.py
    "DISPATCH_MS_PER_LAYER = {'vllm': 0.8}",  # plan/speed.py
    "QUEUE_FACTOR_ENGINES = ('trtllm', 'sglang')",  # plan/speed.py
    "if recipe.build.backend is Backend.SGLANG and accounting is Accounting.EXACT: pass",  # plan/model.py
    "if chosen == Backend.SGLANG.value and not on_cpu: pass",  # cli/init.py
    "BACKEND_ENGINE = {'vllm': 'vllm', 'sglang': 'sglang', 'llmapi': 'tensorrt_llm'}",  # engines/kv_scale_loaders.py
    "BACKEND_ENGINE = {'reference': 'tensorrt_llm', 'vllm': 'vllm', 'llmapi': 'tensorrt_llm_pytorch'}",  # fidelity
    "OVERLAP_ENGINES = ('vllm', 'trtllm', 'sglang')",  # plan/in_flight.py
    "WHOLE_PROMPT_ENGINES = ('trtllm',)",  # plan/waves.py
    "MXFP8_ACTIVATION_ENGINES = frozenset({'trtllm'})",  # plan/moe_step.py
    "INCLUSIVE = {'vllm': 'OffloadingConnector', 'sglang': 'HiCache'}",  # plan/prefix_reuse.py
    "EXCLUSIVE = {'trtllm': 'secondary pool'}",  # plan/prefix_reuse.py
    "NO_DISK_TIER = {Backend.VLLM: 'fs tier', Backend.SGLANG: 'file backend'}",  # recipe/kv_tiers.py
    "ENGINE_SEMANTICS = {'tensorrt_llm': ('shared',), 'vllm': ('split',), 'tensorrt_llm_pytorch': ('one',)}",
    "NO_TOKEN_LOG_PROBS_ON_TRITON = ('llmapi',)",  # recipe/enums.py
]


def test_the_check_catches_each_table_folded() -> None:
    for line in FOLDED:
        assert engine_tables(line) != [], line


def test_the_check_leaves_other_vocabularies_alone() -> None:
    for line in [
        "TOTALS = {'documents': 0.0, 'serve': 0.0, 'reference': 0.0}",  # a word that is also a backend's name
        "NEEDS = ('nvidia-modelopt', 'tensorrt_llm', 'torch')",  # a Python package
        "TARGETS = {**targets, 'tensorrt_llm': trtllm, 'hf': hf}",  # calibrate's output folders
        "if backend is Backend.VLLM: pass",  # a backend's rule in a recipe rule module
    ]:
        assert engine_tables(line, rules=True) == [], line


def _tasks(*overrides: str) -> list[str]:
    return [t.value for t in load_recipe("llama70b_fp8kv", list(overrides)).bench.tasks]


def test_an_engine_whose_triton_model_has_no_token_log_probs_needs_only_its_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """The row's token_log_probs_on_triton alone decides the fidelity default (the fidelity task needs one log-prob per
    token): an engine (here tensorrt's row) with it false gets fidelity by default over OpenAI only, as llmapi does."""
    assert "fidelity" in _tasks("bench.protocol=grpc")
    monkeypatch.setitem(BACKEND_ROWS, Backend.TENSORRT, replace(BACKEND_ROWS[Backend.TENSORRT],
                                                                 token_log_probs_on_triton=False))
    for protocol, expected in [("grpc", False), ("http", False), ("openai", True)]:
        assert ("fidelity" in _tasks(f"bench.protocol={protocol}")) is expected, protocol
    assert _tasks("bench.protocol=grpc", "bench.tasks=[fidelity]") == ["fidelity"]  # named tasks stay


def test_the_row_says_what_the_backends_triton_model_returns() -> None:
    """token_log_probs_on_triton is the Triton layout's interface (per_token_log_probs, which the fidelity task checks
    as it runs), for every backend that has a Triton repository."""
    layouts = {b: obj.repo.interface for b, obj in BACKENDS.items() if obj.repo is not None}
    assert Backend.LLMAPI in layouts and Backend.TENSORRT in layouts
    for backend, interface in layouts.items():
        assert BACKEND_ROWS[backend].token_log_probs_on_triton is interface.per_token_log_probs, backend
