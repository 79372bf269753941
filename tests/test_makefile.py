"""`make check` (the inner loop, < 3 min) leaves out only marked tests, and `make test` (what CI runs) runs them all."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def recipe(target: str) -> list[str]:
    """The command lines of a Makefile target."""
    lines = (ROOT / "Makefile").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(rf"{target}:", line))
    body = []
    for line in lines[start + 1:]:
        if not line.startswith("\t"):
            break
        body.append(line.strip())
    return body


def test_make_check_leaves_out_e2e_and_slow_and_make_test_runs_everything() -> None:
    check = [line for line in recipe("check") if "pytest" in line]
    test = [line for line in recipe("test") if "pytest" in line]
    assert len(check) == 1 and '-m "not e2e and not slow"' in check[0], check
    assert len(test) == 1 and not re.search(r" -[mk] ", test[0].replace("-m pytest", "")), test  # CI runs all
    registered = set(re.findall(r'^    "(\w+): ', (ROOT / "pyproject.toml").read_text(), re.M))
    assert registered >= {"e2e", "slow"}, registered
