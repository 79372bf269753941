"""trtkv's import graph has no cycles: every `import trtkv...` counts, at module level or inside a function (a lazy
import only hides a cycle); imports under `if TYPE_CHECKING:` are for annotations and do not run."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "trtkv"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def runtime_imports(tree: ast.AST) -> list[str]:
    """Every trtkv module a file imports when it runs (TYPE_CHECKING blocks skipped)."""
    out: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            out.extend(a.name for a in node.names if a.name.startswith("trtkv"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("trtkv"):
            out.append(node.module)
            out.extend(f"{node.module}.{a.name}" for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return out


def import_graph() -> dict[str, set[str]]:
    files = [p for p in PACKAGE.rglob("*.py") if "templates" not in p.parts]
    modules = {module_name(p): p for p in files}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = {t for t in runtime_imports(ast.parse(path.read_text())) if t in modules}
        # a submodule importing its own package (`from trtkv.repo import x` inside trtkv.repo.y) is not a cycle edge
        graph[name] = {t for t in targets if t != name and not name.startswith(t + ".")}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := dfs(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := dfs(start)):
            return found
    return None


def test_finder_sees_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_runtime_imports_count_lazy_ones_and_skip_type_checking() -> None:
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from trtkv.recipe import Recipe\n"
                     "def f():\n    from trtkv.checkpoints.models import x\n")
    assert runtime_imports(tree) == ["trtkv.checkpoints.models", "trtkv.checkpoints.models.x"]


def test_trtkv_has_no_import_cycle() -> None:
    graph = import_graph()
    assert len(graph) > 50
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_module_takes_a_plain_attribute_from_the_package_root() -> None:
    """`from trtkv import <not a submodule>` reads an attribute of the package root, which names only its version
    (test_the_package_root_imports_nothing_for_its_side_effects): a module needing more would read a half-initialised
    package the day the root imports anything. Submodules are fine; `__version__` lives in trtkv/version.py."""
    submodules = {p.stem for p in PACKAGE.iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file()}
    bad = []
    for path in PACKAGE.rglob("*.py"):
        if "templates" in path.parts or path == PACKAGE / "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "trtkv":
                bad += [f"{path.name}: {a.name}" for a in node.names if a.name not in submodules]
    assert bad == []


def every_import(tree: ast.AST) -> list[str]:
    """Every trtkv module a file names in an import, `if TYPE_CHECKING:` blocks included."""
    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend(a.name for a in node.names if a.name.startswith("trtkv"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("trtkv"):
            out.append(node.module)
            out.extend(f"{node.module}.{a.name}" for a in node.names)
    return out


def test_no_cycle_even_through_annotation_imports() -> None:
    """The house rule is stricter than what runs: a type-only import that closes a loop is a cycle too (a module
    reaches itself), e.g. a backend annotating with the repository's plan while the repository imports the backends."""
    files = [p for p in PACKAGE.rglob("*.py") if "templates" not in p.parts]
    modules = {module_name(p): p for p in files}
    graph = {name: {t for t in every_import(ast.parse(path.read_text())) if t in modules and t != name
                    and not name.startswith(t + ".")}
             for name, path in modules.items()}
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])
    packages = find_cycle(package_graph(graph))  # packages too: recipe -> checkpoints for a type closed a loop once
    assert packages is None, "package cycle through annotation imports: " + " -> ".join(packages or [])


# The four layers, imports only downward (a package may import its own layer while the package graph stays acyclic).
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    ("foundation", frozenset({"core", "platform", "contracts", "units", "version"})),
    ("model and formats", frozenset({"recipe", "checkpoints", "kvcache", "runtime", "measures"})),
    ("engines", frozenset({"engines", "backends"})),
    ("stages", frozenset({"plan", "calibrate", "build", "repo", "serving", "bench", "probe", "report", "deploy"})),
    ("cli", frozenset({"cli", "__main__", "__init__"})),
)


def package_of(module: str) -> str:
    """`trtkv.serving.serve` -> `serving`; `trtkv` itself -> `__init__`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def layer_of(package: str) -> int:
    for rank, (_name, packages) in enumerate(LAYERS):
        if package in packages:
            return rank
    raise AssertionError(f"trtkv.{package} is in no layer: add it to LAYERS in tests/test_imports.py")


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for module, targets in graph.items():
        src = package_of(module)
        out.setdefault(src, set()).update(package_of(t) for t in targets if package_of(t) != src)
    return out


def test_imports_go_only_downward_through_the_four_layers() -> None:
    """Every import (lazy ones too) goes to the same layer or a lower one: foundation -> model and formats -> engines
    -> stages -> cli."""
    upward = sorted(f"{m} ({LAYERS[layer_of(package_of(m))][0]}) imports {t} ({LAYERS[layer_of(package_of(t))][0]})"
                    for m, targets in import_graph().items() for t in targets
                    if layer_of(package_of(t)) > layer_of(package_of(m)))
    assert upward == []


def test_the_layer_check_sees_an_upward_import() -> None:
    graph = {"trtkv.contracts.stage": {"trtkv.recipe.schema"}, "trtkv.recipe.schema": set()}
    assert [(m, t) for m, ts in graph.items() for t in ts if layer_of(package_of(t)) > layer_of(package_of(m))] == \
        [("trtkv.contracts.stage", "trtkv.recipe.schema")]


def test_the_package_graph_has_no_cycle() -> None:
    """Packages, not just modules: `serving -> bench -> serving` through two different modules is a cycle too."""
    cycle = find_cycle(package_graph(import_graph()))
    assert cycle is None, "package cycle: " + " -> ".join(cycle or [])


def test_at_most_six_modules_at_the_top_level() -> None:
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 6, top


def test_the_package_root_imports_nothing_for_its_side_effects() -> None:
    """`import trtkv.core.errors` must not run the backends, pydantic or yaml: trtkv/__init__ names only its version."""
    assert runtime_imports(ast.parse((PACKAGE / "__init__.py").read_text())) in (
        ["trtkv.version", "trtkv.version.__version__"],)


def test_validation_needs_no_backend_import_and_errors_load_nothing_heavy() -> None:
    """A recipe's backend rules apply with trtkv.backends never imported (they are the model layer's), and importing
    the errors module loads neither pydantic nor yaml nor any other trtkv package."""
    import subprocess
    import sys

    code = ("import sys, trtkv.core.errors\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'yaml', 'torch')\n"
            "               or (m.startswith('trtkv.') and not m.startswith(('trtkv.core', 'trtkv.version'))))\n"
            "print('errors-loads', heavy)\n"
            "from trtkv.core.errors import RecipeError\n"
            "from trtkv.recipe import load_recipe\n"
            "try:\n"
            "    load_recipe('smollm2_fp8kv_vllm', overrides=['quantization.kv_cache=int8'])\n"
            "except RecipeError as e:\n"
            "    print('refused', 'vLLM' in str(e))\n"
            "print('backends-imported', 'trtkv.backends' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=PACKAGE.parent).stdout.splitlines()
    assert out == ["errors-loads []", "refused True", "backends-imported False"]


def test_every_trtkv_module_an_import_names_exists() -> None:
    """mypy ignores missing imports here (ignore_missing_imports), so a lazy import of a moved or misspelt trtkv module
    would pass lint and fail only when that code path runs: every `trtkv...` module an import names must exist."""
    files = [p for p in PACKAGE.rglob("*.py") if "templates" not in p.parts]
    modules = {module_name(p) for p in files}
    missing = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
            missing += [f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {n}" for n in names
                        if n.startswith("trtkv") and n not in modules]
    assert missing == []


def test_no_module_is_over_450_lines() -> None:
    """One job per module: a module past 450 lines is split by job (trtkv/plan/, trtkv/kvcache/quant.py's parts)."""
    long = sorted(f"{p.relative_to(PACKAGE.parent)}: {n}" for p in PACKAGE.rglob("*.py") if "templates" not in p.parts
                  and (n := len(p.read_text().splitlines())) > 450)
    assert long == []


STAGES = LAYERS[3][1]


def stage_imports(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """(module, stage package) for every import of a stage module into another stage's package."""
    return {(m, package_of(t)) for m, targets in graph.items() for t in targets
            if package_of(m) in STAGES and package_of(t) in STAGES and package_of(t) != package_of(m)}


def test_stages_talk_through_folders() -> None:
    """No stage package imports another (22 imports once, bench -> probe and report -> bench the most): a stage reads
    another's output folder through its typed model (trtkv.contracts), what two stages share lives below them
    (trtkv.measures: records, metrics, statistics, probe.json read back; trtkv.backends: the container and bundled
    server commands), and what only the CLI can join it joins: it plans and hands the plan's figures
    (trtkv.contracts.PlanFigures) to deploy, report and the served-pool read-back, and lends bench the serving side
    (trtkv.cli.bench.served_side). Annotation-only imports count too: a stage does not name another's types."""
    assert sorted(stage_imports(import_graph())) == []
    files = [p for p in PACKAGE.rglob("*.py") if "templates" not in p.parts]
    modules = {module_name(p): p for p in files}
    typed = {name: {t for t in every_import(ast.parse(path.read_text())) if t in modules}
             for name, path in modules.items()}
    assert sorted(stage_imports(typed)) == []


def test_the_stage_check_sees_a_stage_importing_another() -> None:
    graph = {"trtkv.report.summary": {"trtkv.bench.sweep", "trtkv.measures.sweep"}, "trtkv.bench.sweep": set()}
    assert stage_imports(graph) == {("trtkv.report.summary", "bench")}
