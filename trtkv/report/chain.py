"""The whole chain for one recipe (`make demo`), and several recipes side by side (`make compare`).

Each step runs as its own `trtkv <verb>` process, exactly as a user would type it, so memory is
returned between steps and a failing step shows its own error. The server is stopped even when a
step fails.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from trtkv.core.errors import StageError

CHAIN = ("calibrate", "build", "repo", "serve", "bench", "report")


@dataclass
class StepResult:
    verb: str
    seconds: float
    returncode: int


@dataclass
class ChainResult:
    recipe: str
    steps: list[StepResult] = field(default_factory=list)
    failed: str | None = None

    @property
    def seconds(self) -> float:
        return sum(s.seconds for s in self.steps)


def trtkv_command(verb: str, recipe: str, extra: Sequence[str] = ()) -> list[str]:
    return [sys.executable, "-m", "trtkv", verb, recipe, *extra]


def _run(cmd: list[str]) -> int:
    return subprocess.run(cmd, check=False).returncode


def run_chain(
    recipe: str,
    overrides: Sequence[str] = (),
    *,
    steps: Sequence[str] = CHAIN,
    runner: Callable[[list[str]], int] = _run,
    log: Callable[[str], None] = print,
) -> ChainResult:
    """Run the steps in order; stop at the first failure; always stop a server this chain
    started."""
    result = ChainResult(recipe)
    started_server = False
    # vLLM, SGLang: their own OpenAI server
    if "repo" in steps and not has_triton_repo(recipe, overrides):
        log(
            f"\n=== trtkv repo {recipe}: skipped (its backend serves without a Triton repository) "
            "==="
        )
        steps = [v for v in steps if v != "repo"]
    try:
        for verb in steps:
            log(f"\n=== trtkv {verb} {recipe} ===")
            extra = list(overrides)
            if verb == "report":
                extra.append("--quiet")  # the chain prints the summary once, at its end
            start = time.time()
            code = runner(trtkv_command(verb, recipe, extra))
            result.steps.append(StepResult(verb, time.time() - start, code))
            if verb == "serve" and code == 0:
                started_server = True
            if code != 0 and not (verb == "bench" and code == 1):
                result.failed = verb
                break
            if verb == "bench" and code == 1:
                # bench exits 1 when a threshold is breached: the chain goes on to the report, then
                # fails
                result.failed = "bench (thresholds breached)"
    finally:
        if started_server or "serve" in steps:
            log(f"\n=== trtkv stop {recipe} ===")
            start = time.time()
            code = runner(trtkv_command("stop", recipe, list(overrides)))
            result.steps.append(StepResult("stop", time.time() - start, code))
            if code != 0 and started_server and result.failed is None:
                result.failed = "stop"
    return result


def has_triton_repo(recipe: str, overrides: Sequence[str] = ()) -> bool:
    """Whether the recipe's backend has a Triton repository to write (`trtkv repo`); a recipe that
    does not load keeps the step, whose own error then says why."""
    from trtkv.backends import for_recipe
    from trtkv.core.errors import TrtkvError
    from trtkv.recipe import load_recipe

    try:
        return for_recipe(load_recipe(recipe, list(overrides))).repo is not None
    except TrtkvError:
        return True


def require_success(result: ChainResult) -> None:
    if result.failed:
        raise StageError(
            f"{result.recipe}: the chain failed at `{result.failed}` (see its output above). "
            f"Next: fix that step and rerun; finished stages are skipped as up to date."
        )
