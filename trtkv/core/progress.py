"""One progress display for long work (rich), or nothing when disabled: `trtkv bench` phases and the
probe sweep."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

P = TypeVar("P", bound="Progress")


class Progress:
    """A context manager holding rich progress bars; `task` adds one. Everything is a no-op when
    disabled. `advance` is safe from worker threads (rich locks)."""

    def __init__(self, enabled: bool, label: str = "{task.description:<22}") -> None:
        self._bar: Any = None
        if enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn(label),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                transient=False,
            )

    def __enter__(self: P) -> P:
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()

    def task(self, description: str, total: int) -> Task:
        return Task(
            self._bar, None if self._bar is None else self._bar.add_task(description, total=total)
        )

    def log(self, message: str) -> None:
        """A line above the bars (plain print when disabled)."""
        if self._bar is not None:
            self._bar.console.print(message)
        else:
            print(message, flush=True)


class Task:
    def __init__(self, bar: Any, task_id: Any) -> None:
        self._bar, self._id = bar, task_id

    def advance(self, steps: int = 1, description: str | None = None) -> None:
        if self._bar is not None:
            self._bar.update(
                self._id, advance=steps, **({"description": description} if description else {})
            )

    def callback(self) -> Callable[[Any], None]:
        """A one-argument callback that advances by one (a finished request, say)."""
        return lambda _item: self.advance()
