"""Errors meant for users: each names what is wrong and what to do next."""

from __future__ import annotations


class TrtkvError(Exception):
    """Base of every error the CLI prints without a traceback (exit code 2)."""

    exit_code = 2


class RecipeError(TrtkvError):
    """A recipe that cannot be read or does not validate; carries every problem found."""

    def __init__(self, problems: list[str], header: str = "Recipe is not valid") -> None:
        self.problems = list(problems)
        body = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{header}, found {len(self.problems)} problem(s):\n{body}")


class StageError(TrtkvError):
    """A pipeline stage that could not run or failed; the message says why and what next."""


class ToolError(StageError):
    """An external tool (trtllm-build, tritonserver, ...) exited non-zero."""
