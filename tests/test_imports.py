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
                     "def f():\n    from trtkv.model import x\n")
    assert runtime_imports(tree) == ["trtkv.model", "trtkv.model.x"]


def test_trtkv_has_no_import_cycle() -> None:
    graph = import_graph()
    assert len(graph) > 50
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_module_takes_a_plain_attribute_from_the_package_root() -> None:
    """`trtkv/__init__` imports trtkv.backends (and so most of trtkv): a module that does `from trtkv import
    <not a submodule>` would read a half-initialised package. Submodules are fine; `__version__` lives in
    trtkv/version.py."""
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
