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

from trtkv.core.lazy import typed_imports

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


# Importing these packages runs only their `__init__` (and trtkv.core.lazy): they are imported by light callers (the
# CLI's parser, `trtkv plan`, the errors module) through any of their submodules, so their faces load names lazily.
LIGHT = ("bench", "build", "contracts", "core", "kvcache", "plan", "platform", "report", "serving")
HEAVY = ("torch", "transformers", "pydantic", "yaml", "numpy", "matplotlib", "httpx", "safetensors")


def lazy_face(package: str) -> tuple[set[str], set[str], set[str]]:
    """(submodules, names given lazily, names imported under `if TYPE_CHECKING:`) of a package's `__init__`, read from
    its `attach(__name__, submodules=[...], stub=__file__)` call (trtkv.core.lazy)."""
    tree = ast.parse((PACKAGE / package / "__init__.py").read_text())
    submodules: set[str] = set()
    lazy: set[str] = set()
    typed: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            typed |= {a.asname or a.name for n in node.body if isinstance(n, ast.ImportFrom) for a in n.names}
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and ast.unparse(node.value.func) == "attach":
            for kw in node.value.keywords:
                if kw.arg == "submodules":
                    submodules |= set(ast.literal_eval(kw.value))
                elif kw.arg == "stub":  # the TYPE_CHECKING imports are the lazy names (trtkv.core.lazy)
                    lazy |= {n for names in typed_imports(f"trtkv.{package}", str(PACKAGE / package / "__init__.py"))
                             .values() for n in names}
    return submodules, lazy, typed


def test_every_listed_name_imports_from_its_package() -> None:
    """`from trtkv.plan import Plan` works for every name of every face (issue 47: 270 of 340 did not), and `dir()`
    shows them (PEP 562's `__dir__` for the lazy ones)."""
    import importlib

    missing, unlisted = [], []
    for package in PACKAGES:
        module = importlib.import_module(f"trtkv.{package}")
        assert module.__all__ == face(package)
        missing += [f"trtkv.{package}.{name}" for name in face(package) if not hasattr(module, name)]
        unlisted += [f"trtkv.{package}.{name}" for name in sorted(set(face(package)) - set(dir(module)))]
    assert missing == [], f"{len(missing)} names in __all__ not importable from the package:\n" + "\n".join(missing)
    assert unlisted == [], "face names dir() does not show:\n" + "\n".join(unlisted)


def test_lazy_names_are_listed_and_typed() -> None:
    """A name given lazily is on the face, is imported under TYPE_CHECKING (so mypy sees it) and is not bound eagerly
    too; a lazy submodule is a real one."""
    for package in PACKAGES:
        submodules, lazy, typed = lazy_face(package)
        assert (submodules | lazy) <= set(face(package)), f"trtkv.{package}: lazily given but not listed"
        assert typed == lazy, f"trtkv.{package}: TYPE_CHECKING imports {sorted(typed ^ lazy)} differ from the lazy names"
        assert all((PACKAGE / package / f"{s}.py").is_file() for s in submodules), package


def test_light_packages_stay_light() -> None:
    """Importing a light package (or, through it, any of its modules) loads no other trtkv package's modules and none
    of torch, pydantic, yaml and the like: the faces above import their names on first use."""
    import subprocess
    import sys

    code = ("import importlib, sys\nimportlib.import_module(sys.argv[1])\n"
            "print(sorted(m for m in sys.modules if m.startswith('trtkv') or m.split('.')[0] in sys.argv[2:]))\n")
    for package in LIGHT:
        out = subprocess.run([sys.executable, "-c", code, f"trtkv.{package}", *HEAVY], capture_output=True, text=True,
                             check=True, cwd=PACKAGE.parent).stdout
        assert set(ast.literal_eval(out)) <= {"trtkv", "trtkv.version", "trtkv.core", "trtkv.core.lazy",
                                              f"trtkv.{package}"}, package


def test_the_lazy_face_reader_sees_a_face() -> None:
    submodules, lazy, typed = lazy_face("plan")
    assert "estimate" in submodules and "Plan" in lazy and typed == lazy
    submodules, lazy, typed = lazy_face("core")  # stub=__file__: read from its TYPE_CHECKING imports
    assert "paths" in submodules and "TrtkvError" in lazy and typed == lazy
