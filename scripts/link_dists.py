"""Links installed distributions (and their requirement closure) into a folder a side venv's .pth names: no download."""

# `make install-sglang` runs it with the main venv's python (the CPU torch) and the vLLM venv's (triton), so SGLang's
# parser venv borrows those two and sees nothing else of either venv.
# Usage: python scripts/link_dists.py DEST NAME[==VERSION] ... (a pinned version other than the installed one fails).

from __future__ import annotations

import os
import sys
from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def closure(specs: list[str]) -> dict[str, metadata.Distribution]:
    """The named distributions and everything they require (markers evaluated for this interpreter, no extras)."""
    found: dict[str, metadata.Distribution] = {}
    todo = list(specs)
    while todo:
        req = Requirement(todo.pop())
        name, key = req.name, canonicalize_name(req.name)
        if key in found:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            sys.exit(f"link_dists: {name} is not installed for {sys.executable}. Next: install it there first.")
        if not req.specifier.contains(dist.version, prereleases=True):  # ==2.13.0 holds for 2.13.0+cpu (PEP 440)
            sys.exit(f"link_dists: {name} {dist.version} is installed for {sys.executable}, wanted {req.specifier}. "
                     f"Next: reinstall that venv (make install / make install-vllm).")
        found[key] = dist
        for line in dist.requires or []:
            dep = Requirement(line)
            if dep.marker is None or dep.marker.evaluate({"extra": ""}):
                todo.append(dep.name)
    return found


def link(dest: str, dist: metadata.Distribution) -> list[str]:
    """Symlinks the distribution's top-level packages, modules and .dist-info folder into dest; returns their names."""
    tops = {f.parts[0] for f in dist.files or [] if f.parts and f.parts[0] not in ("..", "__pycache__")}
    tops = {t for t in tops if not t.endswith(".pth")}
    for top in sorted(tops):
        src = dist.locate_file(top)
        target = os.path.join(dest, top)
        if os.path.exists(str(src)) and not os.path.lexists(target):
            os.symlink(str(src), target)
    return sorted(tops)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    dest = argv[0]
    os.makedirs(dest, exist_ok=True)
    for key, dist in sorted(closure(argv[1:]).items()):
        print(f"link_dists: {key} {dist.version}: {' '.join(link(dest, dist))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
