"""Where trtkv looks for aiconfigurator's python and its tool script, from any working folder.

aiconfigurator lives in a venv of its own (`.venv-aic`, which `make install-aiconfigurator` makes in
the trtkv checkout it runs in). trtkv looks for it, in order and without repeats:

1. `$TRTKV_AICONFIGURATOR`: a python that has aiconfigurator (when set, the only place looked);
2. `$TRTKV_HOME/.venv-aic` (or the project root: the checkout trtkv runs from, else the current
   folder);
3. beside the installed trtkv: the checkout the package runs from (an editable install), the
   checkout it was installed from (pip's direct_url.json), and the folder holding the venv trtkv
   runs in (a checkout's `.venv` beside its `.venv-aic`).

tools/aic_estimate.py (which a wheel does not carry) is looked for beside the package, then in the
same folders.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

from trtkv.core import paths

AIC_VENV = ".venv-aic"
AIC_ENV = "TRTKV_AICONFIGURATOR"
TOOL_NAME = Path("tools") / "aic_estimate.py"


def installed_from() -> Path | None:
    """The local folder pip installed trtkv from (direct_url.json), if any."""
    from importlib import metadata

    try:
        text = metadata.distribution("trtkv").read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return None
    if not text:
        return None
    try:
        url = json.loads(text).get("url", "")
    except (json.JSONDecodeError, AttributeError):
        return None
    parsed = urlparse(str(url))
    return Path(unquote(parsed.path)) if parsed.scheme == "file" and parsed.path else None


def folders() -> list[Path]:
    """The folders looked in for `.venv-aic` and tools/, in order, without repeats."""
    found = [
        paths.project_root(),
        paths.PACKAGE_DIR.parent,
        installed_from(),
        Path(sys.prefix).parent,
    ]
    out: list[Path] = []
    for folder in found:
        if folder is not None and folder.resolve() not in out:
            out.append(folder.resolve())
    return out


def pythons() -> list[Path]:
    """Each python looked for, in order."""
    env = os.environ.get(AIC_ENV)
    if env:
        return [Path(env).expanduser()]
    return [folder / AIC_VENV / "bin" / "python" for folder in folders()]


def python_path() -> Path:
    """The first python that exists, else the first looked for."""
    looked = pythons()
    return next((p for p in looked if p.is_file()), looked[0])


def tool_path() -> Path:
    """tools/aic_estimate.py beside the package, else in the first folder that holds it."""
    beside = paths.PACKAGE_DIR.parent / TOOL_NAME
    if beside.is_file():
        return beside
    return next(
        (f / TOOL_NAME for f in folders() if (f / TOOL_NAME).is_file()),
        beside,
    )


def install_hint(version: str) -> str:
    """What was searched and how to install there: the message of a plan without aiconfigurator."""
    env = os.environ.get(AIC_ENV)
    looked = f"{AIC_ENV}={env}" if env else ", ".join(str(p) for p in pythons())
    checkout = next((f for f in folders() if (f / "Makefile").is_file()), None)
    where = f"in {checkout}" if checkout else "in a trtkv checkout"
    return (
        f"looked for {looked}. Next: `make install-aiconfigurator` {where} installs it where trtkv "
        f"looks, or set {AIC_ENV} to a python that has aiconfigurator {version}"
    )
