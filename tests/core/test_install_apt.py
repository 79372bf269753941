"""`make install` never runs apt-get unless asked (ALLOW_APT=1): it reports what the OS lacks instead."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _install_lines(extra: list[str]) -> str:
    """The commands `make install` would run (make -n, the stamp forced out of date)."""
    out = subprocess.run(["make", "-n", "-B", "install", *extra], cwd=ROOT, capture_output=True, text=True,
                         check=False)
    return out.stdout + out.stderr


def test_install_checks_the_system_without_apt_unless_allowed() -> None:
    plain = _install_lines([])
    assert "scripts/check_system.py" in plain
    assert not re.search(r"check_system\.py\s+--fix", plain), plain
    assert re.search(r"check_system\.py\s+--fix", _install_lines(["ALLOW_APT=1"]))
