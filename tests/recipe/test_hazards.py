"""Inputs that used to hang, read without end or take gigabytes (alias bombs, /dev/zero, a FIFO) are refused fast.

Each runs in a child process with an address-space limit and a timeout, so a regression fails the test instead of
hanging or swapping the machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.recipes import GOOD

CHILD = r"""
import json, resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
from trtkv.core.errors import RecipeError
from trtkv.recipe import load_recipe
for name, target in json.loads(sys.argv[1]):
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        load_recipe(target)
        outcome, message = "loaded", ""
    except RecipeError as exc:
        outcome, message = "RecipeError", str(exc)
    except BaseException as exc:  # what the test must never see; MemoryError under the limit above
        outcome, message = type(exc).__name__, str(exc)[:300]
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    print(json.dumps({"name": name, "outcome": outcome, "message": message, "seconds": seconds,
                      "cpu_seconds": cpu_seconds, "grown_mb": grown_mb}), flush=True)
"""


def dict_bomb(keys: int, levels: int) -> str:
    """A billion-laughs mapping: each level maps `keys` keys to the level below (keys ** levels leaves)."""
    lines = ["l0: &l0 {" + ", ".join(f"k{i}: lol" for i in range(keys)) + "}"]
    for level in range(1, levels + 1):
        lines.append(f"l{level}: &l{level} {{" + ", ".join(f"k{i}: *l{level - 1}" for i in range(keys)) + "}")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("hazards")
    files = {
        "bomb_many_aliases": GOOD + dict_bomb(9, 7),  # 63 aliases, 9**7 = 4.8 M leaves
        "bomb_few_aliases": GOOD + dict_bomb(3, 10),  # 30 aliases (under the count), 3**10 = 59 k leaves
        "dev_zero": "include: /dev/zero\n",
        "fifo_include": "include: pipe.yaml\n",
    }
    for name, text in files.items():
        (tmp / f"{name}.yaml").write_text(text)
    os.mkfifo(tmp / "pipe.yaml")
    cases = [[name, str(tmp / f"{name}.yaml")] for name in files] + [["fifo_direct", str(tmp / "pipe.yaml")]]
    out = ""
    for case in cases:  # one child each: a case that hangs costs its own timeout only
        try:
            proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps([case])], capture_output=True, text=True,
                                  timeout=20, cwd=Path(__file__).resolve().parents[2])
            out += proc.stdout
        except subprocess.TimeoutExpired:
            pass
    return {row["name"]: row for row in map(json.loads, out.splitlines())}


@pytest.mark.parametrize("name", ["bomb_many_aliases", "bomb_few_aliases"])
def test_alias_bomb_is_refused_fast_and_small(outcomes: dict[str, dict[str, Any]], name: str) -> None:
    row = outcomes.get(name)
    assert row is not None, f"{name}: no answer within 20 s"
    assert row["outcome"] == "RecipeError", row
    assert f"{name}.yaml:" in row["message"] and "not plain recipe data" in row["message"], row
    assert "aliases" in row["message"], row
    # the work is CPU time (a machine shared with other jobs stretches the wall clock, not this); a read that
    # blocks burns no CPU, so the wall clock keeps a bound of its own, far under the 20 s a hang costs
    assert row["cpu_seconds"] < 0.5 and row["seconds"] < 5 and row["grown_mb"] < 100, row


@pytest.mark.parametrize("name,words", [("dev_zero", "/dev/zero: a character device, not a regular file"),
                                        ("fifo_include", "pipe.yaml: a FIFO, not a regular file (included from"),
                                        ("fifo_direct", "pipe.yaml: not a regular file")])
def test_special_files_are_refused_without_reading(outcomes: dict[str, dict[str, Any]], name: str, words: str) -> None:
    row = outcomes.get(name)
    assert row is not None, f"{name}: no answer within 20 s (a read without end, or a blocked open)"
    assert row["outcome"] == "RecipeError" and words in row["message"], row
    # the work is CPU time (a machine shared with other jobs stretches the wall clock, not this); a read that
    # blocks burns no CPU, so the wall clock keeps a bound of its own, far under the 20 s a hang costs
    assert row["cpu_seconds"] < 0.5 and row["seconds"] < 5 and row["grown_mb"] < 100, row
