"""Package faces that import their modules on first use (PEP 562), as scientific-python's
`lazy_loader.attach` does.

A package imports each name of its face under `if TYPE_CHECKING:` (so mypy sees it) and passes
`stub=__file__`: those imports, read from the file, say which submodule defines each name, as
`lazy_loader.attach_stub` reads a .pyi. `from trtkv.plan import Plan` then imports trtkv.plan.result
at that moment, so a caller that needs one light module of a package never loads the package's heavy
ones (torch, pydantic, yaml)."""

from __future__ import annotations

import importlib
import sys

# typing.TYPE_CHECKING without importing typing, which a light caller (`trtkv --help`) never loads;
# mypy reads any `if TYPE_CHECKING:` block as true
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any


def attach(
    package: str,
    submodules: Iterable[str] = (),
    *,
    stub: str | None = None,
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The `__getattr__` and `__dir__` of `package`: each of `submodules` is the submodule itself,
    each name `stub` imports from a submodule is that submodule's attribute."""
    attrs = typed_imports(package, stub) if stub else {}
    homes = {name: module for module, names in attrs.items() for name in names}
    modules = set(submodules)

    def __getattr__(name: str) -> Any:
        if name in modules:
            return importlib.import_module(f"{package}.{name}")
        if name in homes:
            return getattr(importlib.import_module(f"{package}.{homes[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | modules | set(homes))

    return __getattr__, __dir__


def typed_imports(package: str, path: str) -> dict[str, list[str]]:
    """Submodule -> the names `path` (a package's `__init__.py`) imports from it under
    `if TYPE_CHECKING:`."""
    import ast

    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    attrs: dict[str, list[str]] = {}
    for node in tree.body:
        if not (isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"):
            continue
        for imp in node.body:
            if isinstance(imp, ast.ImportFrom) and (imp.module or "").startswith(package + "."):
                module = (imp.module or "")[len(package) + 1 :]
                attrs.setdefault(module, []).extend(a.name for a in imp.names)
    return attrs
