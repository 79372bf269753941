"""Check what the OS must provide for Triton's Python backend stub (run by `make install` with --fix).

The `tritonserver` bundled in nvidia-pytriton runs Python models through `triton_python_backend_stub`, which links
`libpython3.X.so.1.0`. `trtkv serve` starts the server with LD_LIBRARY_PATH set to this interpreter's LIBDIR, so
the stub loads the libpython this venv was built from (a pyenv Python ships its own there; mixing it with another
3.X build breaks imports inside models with `undefined symbol: _PyModule_Add`). When LIBDIR has no shared
libpython (a statically linked interpreter), the system's must exist: Debian package `libpython3.X`, which --fix
installs with apt-get when it can.

    python scripts/check_system.py          # report; exit 1 when the stub cannot start
    python scripts/check_system.py --fix    # also apt-get install libpython3.X when it is missing
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

TAG = f"{sys.version_info.major}.{sys.version_info.minor}"
LIBPYTHON = f"libpython{TAG}.so.1.0"
DEB_PACKAGE = f"libpython{TAG}"


def stub_path() -> Path | None:
    """The Python backend stub for this Python inside the installed nvidia-pytriton, or None."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations))) / "tritonserver" / "python_backend_stubs" / TAG
    stub = root / "triton_python_backend_stub"
    return stub if stub.is_file() else None


def libdir() -> str:
    return str(sysconfig.get_config_var("LIBDIR") or "")


def resolve(stub: Path) -> dict[str, str]:
    """ldd of the stub with LD_LIBRARY_PATH as `trtkv serve` sets it: library name -> path or 'not found'."""
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in [libdir(), env.get("LD_LIBRARY_PATH", "")] if p)
    out = subprocess.run(["ldd", str(stub)], capture_output=True, text=True, env=env, check=False).stdout
    found = {}
    for line in out.splitlines():
        if "=>" in line:
            name, target = (part.strip() for part in line.split("=>", 1))
            found[name] = target.split(" (")[0].strip()
    return found


def apt_install(package: str) -> bool:
    """apt-get install `package` when apt-get exists and we may use it; True when it worked."""
    apt = shutil.which("apt-get")
    if apt is None:
        print(f"check_system: apt-get is not available; install {package} with your package manager.")
        return False
    prefix: list[str] = []
    if os.geteuid() != 0:
        if shutil.which("sudo") is None:
            print(f"check_system: not root and no sudo; run as root: apt-get install -y {package}")
            return False
        prefix = ["sudo", "-n"]
    print(f"check_system: installing {package} (apt-get)...", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    code = subprocess.run([*prefix, apt, "install", "-y", "--no-install-recommends", package], env=env,
                          check=False).returncode
    if code != 0:
        print(f"check_system: `apt-get install -y {package}` failed (exit {code}); try `apt-get update` first.")
    return code == 0


def check(fix: bool) -> int:
    stub = stub_path()
    if stub is None:
        print(f"check_system: nvidia-pytriton has no Python backend stub for Python {TAG} (or is not installed). "
              f"Next: `pip install nvidia-pytriton==0.7.0` in a venv made with Python 3.8-3.13.")
        return 1
    libs = resolve(stub)
    target = libs.get(LIBPYTHON, "not found")
    if target == "not found" and fix and apt_install(DEB_PACKAGE):
        libs = resolve(stub)
        target = libs.get(LIBPYTHON, "not found")
    missing = sorted(name for name, path in libs.items() if path == "not found")
    if missing:
        print(f"check_system: {stub.name} cannot start: {', '.join(missing)} not found.")
        if LIBPYTHON in missing:
            print(f"  Next: `apt-get install -y {DEB_PACKAGE}` (or `python scripts/check_system.py --fix` as root), "
                  f"or make the venv from a Python built with --enable-shared.")
        return 1
    own = Path(libdir()) / LIBPYTHON
    if own.exists() and Path(target).resolve() == own.resolve():
        origin = "this interpreter's own (LD_LIBRARY_PATH=LIBDIR, as `trtkv serve` sets it)"
    else:
        origin = "the system's"
        print(f"check_system: note: {sys.executable} has no shared {LIBPYTHON} in LIBDIR {libdir()}; the stub uses "
              f"the system's {target}. If Python models then fail with `undefined symbol`, make the venv from the "
              f"system python{TAG}.")
    print(f"check_system: ok: Triton's Python backend stub ({TAG}) resolves {LIBPYTHON} -> {target} ({origin})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fix", action="store_true", help=f"apt-get install {DEB_PACKAGE} when it is missing")
    return check(parser.parse_args(argv).fix)


if __name__ == "__main__":
    sys.exit(main())
