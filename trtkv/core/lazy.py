"""Package faces that import their modules on first use (PEP 562), as scientific-python's
`lazy_loader.attach` does.

A package lists each name of its face with the submodule that defines it; `from trtkv.plan import
Plan` then imports trtkv.plan.result at that moment, so a caller that needs one light module of a
package never loads the package's heavy ones (torch, pydantic, yaml). The package also imports the
same names under `if TYPE_CHECKING:` so mypy sees them (tests/test_exported_members.py keeps the two
lists equal)."""

from __future__ import annotations

import importlib
import sys

# typing.TYPE_CHECKING without importing typing, which a light caller (`trtkv --help`) never loads;
# mypy reads any `if TYPE_CHECKING:` block as true
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping
    from typing import Any


def attach(
    package: str,
    submodules: Iterable[str] = (),
    submod_attrs: Mapping[str, Iterable[str]] | None = None,
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The `__getattr__` and `__dir__` of `package`: each of `submodules` is the submodule itself,
    each name in `submod_attrs[module]` is that submodule's attribute."""
    homes = {name: module for module, names in (submod_attrs or {}).items() for name in names}
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
