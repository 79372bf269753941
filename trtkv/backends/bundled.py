"""The tritonserver bundled in the `nvidia-pytriton` wheel, what `trtkv serve` runs for the CPU
backend `reference` (trtkv.serving.serve) and the tests' local server: where it is, the
Python-backend folder linking its backend and this Python's stub (engines/<recipe>/serve/backends),
the environment it needs (the venv's bin first on PATH, this interpreter's LIBDIR first on
LD_LIBRARY_PATH) and its command line.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig
from pathlib import Path

from trtkv.core.errors import StageError
from trtkv.recipe import Recipe
from trtkv.recipe.layout import serve_dir

STUB_FILES = ("libtriton_python.so", "triton_python_backend_utils.py")


def bundled_triton() -> Path:
    """pytriton/tritonserver inside the installed nvidia-pytriton wheel."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise StageError(
            "the tritonserver bundled in nvidia-pytriton is not installed. "
            "Next: `make install` (it installs nvidia-pytriton==0.7.0)."
        )
    root = Path(next(iter(spec.submodule_search_locations))) / "tritonserver"
    if not (root / "bin" / "tritonserver").is_file():
        raise StageError(
            f"{root / 'bin' / 'tritonserver'} is missing. Next: reinstall nvidia-pytriton."
        )
    return root


def python_tag() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def python_libdir() -> str:
    """The running interpreter's LIBDIR (where its own libpython lives)."""
    return str(sysconfig.get_config_var("LIBDIR") or "")


def prepare_backends(recipe: Recipe) -> Path:
    """engines/<recipe>/serve/backends/python/: links to the bundled Python backend and this
    Python's stub."""
    return link_python_backend(serve_dir(recipe) / "backends")


def link_python_backend(backends: Path) -> Path:
    """A --backend-directory at `backends` whose python/ links the bundled Python backend and this
    Python's stub."""
    root = bundled_triton()
    stub = root / "python_backend_stubs" / python_tag() / "triton_python_backend_stub"
    if not stub.is_file():
        found = sorted(p.name for p in (root / "python_backend_stubs").iterdir())
        raise StageError(
            f"nvidia-pytriton has no Python backend stub for Python {python_tag()} (it has "
            f"{found}). Next: make the venv with one of those Python versions."
        )
    python = backends / "python"
    python.mkdir(parents=True, exist_ok=True)
    targets = {name: root / "backends" / "python" / name for name in STUB_FILES}
    targets["triton_python_backend_stub"] = stub
    for name, target in targets.items():
        link = python / name
        if link.is_symlink() or link.exists():
            if link.is_symlink() and Path(os.readlink(link)) == target:
                continue
            link.unlink()
        link.symlink_to(target)
    return backends


def server_env() -> dict[str, str]:
    """PATH with the venv's bin first, LD_LIBRARY_PATH with this interpreter's LIBDIR first
    (Triton's Python backend stub links libpython: scripts/check_system.py)."""
    env = dict(os.environ)
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bin_dir, env.get("PATH", "")])
    libdir = python_libdir()
    if libdir:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in [libdir, env.get("LD_LIBRARY_PATH", "")] if p
        )
    return env


def bundled_command(
    repo: Path, backends: Path, host: str, ports: tuple[int, int, int], extra: tuple[str, ...] = ()
) -> list[str]:
    """The bundled (CPU) tritonserver on `repo`: the one command builder for `trtkv serve` and the
    test server."""
    http, grpc, metrics = ports
    return [
        str(bundled_triton() / "bin" / "tritonserver"),
        f"--model-repository={repo}",
        f"--backend-directory={backends}",
        f"--http-address={host}",
        f"--http-port={http}",
        f"--grpc-address={host}",
        f"--grpc-port={grpc}",
        f"--metrics-address={host}",
        f"--metrics-port={metrics}",
        "--allow-gpu-metrics=false",
        "--pinned-memory-pool-byte-size=0",
        *extra,
    ]


def local_command(recipe: Recipe, repo: Path, backends: Path) -> list[str]:
    """The bundled tritonserver on the recipe's host and ports."""
    t = recipe.triton
    return bundled_command(
        repo,
        backends,
        t.host,
        (t.http_port, t.grpc_port, t.metrics_port),
        ("--disable-auto-complete-config", "--exit-on-error=true", "--exit-timeout-secs=10"),
    )
