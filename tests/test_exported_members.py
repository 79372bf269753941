"""Package faces (issue 43; httpx's tests/test_exported_members.py is the model): each trtkv package's `__init__.py`
declares `__all__`, its face: the names trtkv modules outside the package import from it, whether from the package
itself or from the submodule that defines them (importing the submodule keeps a light caller light: the planner never
loads torch through trtkv.kvcache). A module outside the package that imports a name not in the face fails here, and
so does a face name nobody outside imports, so the face stays small and says what the package offers.

Outside users are trtkv's own modules (lazy and TYPE_CHECKING imports included) and the Triton model's runtime module
(the repository template reads `trtkv.runtime` by attribute). Tests, scripts and benchmarks may reach inside.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "trtkv"
PACKAGES = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))
TEMPLATE_ATTRIBUTE = re.compile(r"runtime_module\.(\w+)")  # the Triton model: importlib.import_module("trtkv.runtime")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_of(module: str) -> str:
    """`trtkv.recipe.layout` -> `recipe`; `trtkv` and its top-level modules -> ``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in PACKAGES else ""


def imports_from(tree: ast.AST) -> Iterator[tuple[str, str]]:
    """(package, name) for every trtkv name a module imports: `from trtkv.P[.sub] import name` gives `name` (a
    submodule's name when it is one), `import trtkv.P.sub` gives `sub`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("trtkv."):
            target = package_of(node.module + ".x")
            yield from ((target, a.name) for a in node.names if target)
        elif isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] == "trtkv" and len(parts) > 2 and parts[1] in PACKAGES:
                    yield parts[1], parts[2]


def outside_uses() -> dict[str, dict[str, list[str]]]:
    """package -> name -> the outside modules that import it."""
    uses: dict[str, dict[str, list[str]]] = {p: {} for p in PACKAGES}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "templates" in path.parts:
            continue
        me = module_name(path)
        for target, name in imports_from(ast.parse(path.read_text())):
            if target != package_of(me):
                uses[target].setdefault(name, []).append(me)
    for path in sorted((PACKAGE / "repo" / "templates").rglob("*.py")):
        for name in TEMPLATE_ATTRIBUTE.findall(path.read_text()):
            uses["runtime"].setdefault(name, []).append(f"repo template {path.name}")
    return uses


def face(package: str) -> list[str]:
    """The literal `__all__` of trtkv/<package>/__init__.py."""
    tree = ast.parse((PACKAGE / package / "__init__.py").read_text())
    found = [n.value for n in tree.body if isinstance(n, ast.Assign)
             and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)]
    assert len(found) == 1, f"trtkv/{package}/__init__.py declares no __all__ (its face)"
    value = ast.literal_eval(found[0])
    assert isinstance(value, list) and all(isinstance(x, str) for x in value), f"{package}: __all__ is a list of str"
    return value


def defined(package: str) -> set[str]:
    """Every name a module of the package defines or imports at its top level, and the submodules' names."""
    names = {p.stem for p in (PACKAGE / package).glob("*.py")} | {p.parent.name for p in
                                                                  (PACKAGE / package).glob("*/__init__.py")}
    for path in (PACKAGE / package).rglob("*.py"):
        if "templates" in path.parts:
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names |= {t.id for t in targets if isinstance(t, ast.Name)}
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def test_every_package_declares_a_sorted_face() -> None:
    for package in PACKAGES:
        names = face(package)
        assert names == sorted(set(names), key=lambda n: (n.casefold(), n)), f"trtkv/{package}: __all__ unsorted or " \
                                                                              "repeated"


def test_outside_modules_import_only_the_face() -> None:
    uses = outside_uses()
    bad = [f"{who}: imports {name!r} from trtkv.{package}"
           for package in PACKAGES for name, importers in sorted(uses[package].items())
           if name not in face(package) for who in importers]
    assert not bad, ("names outside the package's face (add each to trtkv/<package>/__init__.py's __all__ if it is "
                     "the package's to offer, else import what the face offers):\n" + "\n".join(bad))


def test_every_face_name_is_used_outside_and_exists() -> None:
    uses = outside_uses()
    for package in PACKAGES:
        unused = sorted(set(face(package)) - set(uses[package]))
        assert not unused, f"trtkv/{package}: face names no module outside imports (drop them): {unused}"
        missing = sorted(set(face(package)) - defined(package))
        assert not missing, f"trtkv/{package}: face names no module of the package defines: {missing}"


def test_the_check_sees_an_import_past_the_face() -> None:
    tree = ast.parse("from trtkv.recipe.tree import load_tree\nimport trtkv.kvcache.cache\n"
                     "def f():\n    from trtkv.core import paths\n")
    assert sorted(imports_from(tree)) == [("core", "paths"), ("kvcache", "cache"), ("recipe", "load_tree")]
    assert "load_tree" not in face("recipe") and "cache" not in face("kvcache")
    assert package_of("trtkv.cli") == "cli" and package_of("trtkv.version") == "" and package_of("trtkv") == ""
