"""The RULER hand-off between two stages: the bench makes the plan (its items, tokenizer and
scoring), the probe answers it with each KV format; this is all either needs of the other."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class RulerPlan:
    """What the probe answers (trtkv.probe.ruler), made by the bench
    (trtkv.bench.tasks.ruler.probe_plan): the items, the tokenizer that made them and the bench's
    scoring functions."""

    items: list[Any]  # trtkv.bench.tasks.ruler_gen.RulerItem
    notes: list[str]
    tokenizer: Any
    tokenizer_dir: Path
    tasks: list[str]
    lengths: list[int]
    samples: int
    seed: int
    commit: str
    confidence: float
    match: Callable[[str, Sequence[str]], float]  # string_match_all
    summarize: Callable[[Sequence[Any], Sequence[str]], dict[str, Any]]
