"""No trtkv module uses another module's private name, and every name comes from the module that defines it (issue 47).

A leading underscore says "used only in this module" (STYLE.md: torchtune's `config/_parse.py`); a shared helper drops
it, or moves to where it is used. A name imported from a module that only re-imports it (`probe.ruler` taking `feed`
from `probe.measure`, which takes it from `probe.passes`) hides where the code lives and breaks when the middle module
stops needing it: import it from its home. A package's `__init__` is the one exception, its face
(tests/test_exported_members.py). Both rules hold for `from ... import name` (relative or absolute, lazy and
TYPE_CHECKING imports included) and for `module.name` on a trtkv module bound by an import.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "trtkv"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py") if "templates" not in p.parts}


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def defines(tree: ast.Module) -> set[str]:
    """The names a module binds at its top level other than by importing them (inside `if`/`try` blocks too)."""
    names: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(node, ast.If):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                for block in (node.body, *(h.body for h in node.handlers), node.orelse, node.finalbody):
                    visit(block)

    visit(tree.body)
    return names


def source_of(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a `from ... import` reads, relative imports resolved."""
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def uses(mods: dict[str, Path]) -> Iterator[tuple[str, int, str, str]]:
    """(importing module, line, source module, name) for every trtkv name a module takes from another trtkv module:
    `from src import name`, and `alias.name` where `alias` is a trtkv module bound by an import."""
    for me, path in sorted(mods.items()):
        tree = ast.parse(path.read_text())
        aliases: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                aliases.update({a.asname: a.name for a in node.names if a.asname and a.name in mods})
            elif isinstance(node, ast.ImportFrom):
                src = source_of(me, path.name == "__init__.py", node)
                if src not in mods:
                    continue
                for a in node.names:
                    if f"{src}.{a.name}" in mods:
                        aliases[a.asname or a.name] = f"{src}.{a.name}"
                    yield me, node.lineno, src, a.name
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
                src = aliases[node.value.id]
                if src != me and f"{src}.{node.attr}" not in mods:
                    yield me, node.lineno, src, node.attr


def private_uses(mods: dict[str, Path]) -> list[str]:
    return [f"{me}:{line} takes {name} from {src}" for me, line, src, name in uses(mods)
            if is_private(name) and src != me]


def chains(mods: dict[str, Path]) -> list[str]:
    """Names taken from a module (not a package's face) that does not define them: it only re-imports them."""
    defined = {m: defines(ast.parse(p.read_text())) for m, p in mods.items()}
    return [f"{me}:{line} takes {name} from {src}, which does not define it" for me, line, src, name in uses(mods)
            if src != me and mods[src].name != "__init__.py" and f"{src}.{name}" not in mods
            and name not in defined[src] and not name.startswith("__") and name != "*"]


def test_no_module_uses_another_modules_private_name() -> None:
    bad = private_uses(modules())
    assert bad == [], ("a private name used outside its module (drop the underscore where it is shared, or move the "
                       "code to where it is used):\n" + "\n".join(bad))


def test_every_name_comes_from_the_module_that_defines_it() -> None:
    bad = chains(modules())
    assert bad == [], "re-export chains (import each name from its home module):\n" + "\n".join(bad)


def test_the_checks_see_a_private_name_and_a_chain(tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": "from pkg.home import helper\n",
        "pkg/home.py": "import json\ndef helper(): ...\ndef _inner(): ...\nif True:\n    FLAG = 1\n",
        "pkg/middle.py": "from pkg.home import helper, _inner\n",
        "pkg/user.py": ("from pkg import helper\nfrom pkg.middle import helper as h\nfrom . import home\n"
                        "import pkg.home as hm\nfrom .home import FLAG\n"
                        "def f():\n    return home._inner(), hm.json, home.helper, hm.__name__\n"),
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    mods = {".".join(p.relative_to(tmp_path).with_suffix("").parts).removesuffix(".__init__"): p
            for p in tmp_path.rglob("*.py")}
    assert private_uses(mods) == ["pkg.middle:1 takes _inner from pkg.home", "pkg.user:7 takes _inner from pkg.home"]
    assert chains(mods) == ["pkg.user:2 takes helper from pkg.middle, which does not define it",
                            "pkg.user:7 takes json from pkg.home, which does not define it"]
