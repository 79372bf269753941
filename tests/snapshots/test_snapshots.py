"""Every generated file users keep, byte for byte against tests/data/snapshots/ (issue #43: a refactor changes no
output; a change on purpose regenerates the snapshots and says why in the CHANGELOG).

Covered: `trtkv plan --json` (and the printed table) of every shipped recipe; `trtkv init` recipes for every model
config under tests/data/configs plus the options users pass, each with its plan; the Triton repository `trtkv repo`
writes for every recipe that has one (the GPU recipes' repositories are written without their engines, as `trtkv
repo` allows); `trtkv deploy` for every GPU recipe x k8s/slurm/dynamo (a refused pair keeps its message) and a
multi-node and a target-concurrency case. Not covered: gemma3_fp8kv's repository (it copies Gemma 3's tokenizer,
which needs the 60 s conversion of the packaged model; its layout is smollm2_fp8kv's).

What is normalised, and why, is said in tests/snapshots/outputs.py. Regenerate and see the diff:

    make snapshots        (.venv/bin/python -m pytest -q tests/snapshots --update-snapshots)
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.snapshots import outputs
from tests.snapshots.outputs import DEPLOY_EXTRA, INIT_CASES, TARGETS, Scratch
from trtkv.backends import for_recipe
from trtkv.platform.hardware import GPU
from trtkv.recipe import list_recipes, load_recipe

SNAPSHOTS = Path(__file__).resolve().parents[1] / "data" / "snapshots"
MAX_DIFF_LINES = 300
REGENERATE = "make snapshots   (or: .venv/bin/python -m pytest -q tests/snapshots --update-snapshots)"

RECIPES = [p.stem for p in list_recipes()]
REPO_RECIPES = [n for n in RECIPES if for_recipe(load_recipe(n)).repo is not None and n != "gemma3_fp8kv"]
GPU_RECIPES = [n for n in RECIPES if load_recipe(n).hardware.gpu is not GPU.CPU]
DEPLOY_CASES = [(n, t) for n in [*GPU_RECIPES, *DEPLOY_EXTRA] for t in TARGETS]


def expected_folders() -> set[str]:
    return ({f"plan/{n}" for n in RECIPES} | {f"init/{c}" for c in INIT_CASES} | {f"repo/{n}" for n in REPO_RECIPES}
            | {f"deploy/{n}/{t}" for n, t in DEPLOY_CASES})


@pytest.fixture(scope="module")
def scratch(smollm2_dir: Path) -> Iterator[Scratch]:
    with outputs.scratch(smollm2_dir) as s:
        yield s


def unified(case: str, expected: dict[str, str], got: dict[str, str]) -> str:
    lines: list[str] = []
    for rel in sorted(set(expected) | set(got)):
        old, new = expected.get(rel), got.get(rel)
        if old == new:
            continue
        lines += difflib.unified_diff((old or "").splitlines(), (new or "").splitlines(),
                                      f"snapshot/{case}/{rel}" if old is not None else "/dev/null",
                                      f"now/{case}/{rel}" if new is not None else "/dev/null", lineterm="")
    if len(lines) > MAX_DIFF_LINES:
        lines = lines[:MAX_DIFF_LINES] + [f"... {len(lines) - MAX_DIFF_LINES} more diff lines"]
    return "\n".join(lines)


def compare(case: str, make: Callable[[], dict[str, str]], request: pytest.FixtureRequest,
            capsys: pytest.CaptureFixture[str]) -> None:
    folder = SNAPSHOTS / case
    got, expected = make(), outputs.read_snapshot(folder)
    if got == expected:
        return
    diff = unified(case, expected, got)
    if request.config.getoption("--update-snapshots"):
        outputs.write_snapshot(folder, got)
        with capsys.disabled():
            print(f"\nsnapshot {case}: {'updated' if expected else 'written'}\n{diff if expected else ''}")
        return
    pytest.fail(f"{case}: what trtkv writes now differs from tests/data/snapshots/{case} "
                f"(normalisation: tests/snapshots/outputs.py):\n{diff}\n\nIf the change is intended, regenerate with\n"
                f"    {REGENERATE}\nand say in the CHANGELOG what changed and why.", pytrace=False)


@pytest.mark.parametrize("recipe", RECIPES)
def test_plan(recipe: str, scratch: Scratch, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]) -> None:
    compare(f"plan/{recipe}", lambda: outputs.plan_outputs(recipe, scratch), request, capsys)


@pytest.mark.parametrize("case", INIT_CASES)
def test_init(case: str, scratch: Scratch, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]) -> None:
    compare(f"init/{case}", lambda: outputs.init_outputs(case, scratch), request, capsys)


@pytest.mark.parametrize("recipe", REPO_RECIPES)
def test_repo(recipe: str, scratch: Scratch, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]) -> None:
    compare(f"repo/{recipe}", lambda: outputs.repo_outputs(recipe, scratch), request, capsys)


@pytest.mark.parametrize(("case", "target"), DEPLOY_CASES)
def test_deploy(case: str, target: str, scratch: Scratch, request: pytest.FixtureRequest,
                capsys: pytest.CaptureFixture[str]) -> None:
    compare(f"deploy/{case}/{target}", lambda: outputs.deploy_outputs(case, target, scratch), request, capsys)


def test_no_stale_snapshots(request: pytest.FixtureRequest) -> None:
    """A snapshot no case writes any more (a recipe renamed or removed, a file no longer written) goes too."""
    cases = expected_folders()

    def case_of(rel: Path) -> str | None:
        return next((c for c in ("/".join(rel.parts[:i]) for i in range(2, len(rel.parts))) if c in cases), None)

    stale = sorted(p for p in SNAPSHOTS.rglob("*")
                   if p.is_file() and p.parent != SNAPSHOTS and case_of(p.relative_to(SNAPSHOTS)) is None)
    if stale and request.config.getoption("--update-snapshots"):
        for path in stale:
            path.unlink()
        for folder in sorted((p for p in SNAPSHOTS.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            if not any(folder.iterdir()):
                folder.rmdir()
        return
    assert not stale, f"snapshots no case writes: {[str(p.relative_to(SNAPSHOTS)) for p in stale]}. Next: {REGENERATE}"
