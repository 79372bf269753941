"""SLOs `metric.stat<=value` (from the recipe's bench.thresholds and `--slo`): parsing and
checking."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from trtkv.contracts import BenchLevel, TaskScore
from trtkv.core.errors import TrtkvError
from trtkv.measures.metrics import LEVEL_METRICS, SYSTEM_METRICS
from trtkv.measures.stats import STATS
from trtkv.recipe import SLO_PATTERN

OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    ">=": operator.ge,
    "<": operator.lt,
    ">": operator.gt,
}
ACCURACY_STATS = {
    "quiz": ("accuracy", "correct", "total"),
    "golden": ("agreement", "exact_match", "total"),
    "needle": ("accuracy", "correct", "total"),
    # string_match_all; `correct` counts items scored 1.0
    "ruler": ("accuracy", "correct", "total"),
    # lengths judged worse than the format predicts (trtkv.bench.tasks.fidelity)
    "fidelity": ("worse_lengths", "accuracy"),
}
SYSTEM_STATS = ("avg",)
# request_errors.failed / request_errors.rate over measured requests
FAILURE_STATS = ("failed", "rate")


@dataclass(frozen=True)
class SLO:
    metric: str
    stat: str
    op: str
    value: float
    source: str  # "recipe" or "--slo"

    @property
    def text(self) -> str:
        return f"{self.metric}.{self.stat}{self.op}{self.value:g}"


@dataclass
class SLOResult:
    slo: SLO
    where: str  # the level ("concurrency=4") or task it was checked on
    measured: float | None
    passed: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "slo": self.slo.text,
            "source": self.slo.source,
            "where": self.where,
            "measured": self.measured,
            "passed": self.passed,
        }


def allowed_stats(metric: str) -> tuple[str, ...] | None:
    if metric in LEVEL_METRICS:
        return STATS
    if metric in SYSTEM_METRICS:
        return SYSTEM_STATS
    if metric in ACCURACY_STATS:
        return ACCURACY_STATS[metric]
    if metric == "request_errors":
        return FAILURE_STATS
    return None


def all_metrics() -> list[str]:
    return [*LEVEL_METRICS, *SYSTEM_METRICS, *ACCURACY_STATS, "request_errors"]


def parse_slo(text: str, source: str = "--slo") -> SLO:
    """`time_to_first_token.p99<=500` -> SLO; a clear error naming the allowed metrics and stats."""
    match = SLO_PATTERN.match(text.strip())
    if not match:
        raise TrtkvError(
            f"{source} {text!r}: expected METRIC.STAT<=VALUE (or >=, <, >), e.g. "
            f"time_to_first_token.p99<=500 or quiz.accuracy>=0.3."
        )
    metric, stat = match["metric"], match["stat"]
    stats = allowed_stats(metric)
    if stats is None:
        raise TrtkvError(
            f"{source} {text!r}: unknown metric {metric!r}. Allowed: {', '.join(all_metrics())}."
        )
    if stat not in stats:
        raise TrtkvError(
            f"{source} {text!r}: {metric} has no stat {stat!r}. Allowed: {', '.join(stats)}."
        )
    return SLO(metric, stat, match["op"], float(match["value"]), source)


NO_FAILURES = SLO(
    "request_errors",
    "failed",
    "<=",
    0.0,
    "default: any failed request fails the bench (--allow-failures lifts it)",
)


FIDELITY_AS_PREDICTED = SLO(
    "fidelity",
    "worse_lengths",
    "<=",
    0.0,
    "default: the served KV cache does what its format predicts at every length (task fidelity)",
)


def with_fidelity(slos: list[SLO], tasks: Iterable[str]) -> list[SLO]:
    """The fidelity task's verdict as an SLO (`fidelity.worse_lengths<=0`) when the task runs and
    none names it."""
    if "fidelity" in tasks and not any(s.metric == "fidelity" for s in slos):
        return [*slos, FIDELITY_AS_PREDICTED]
    return slos


def parse_all(
    recipe_thresholds: Iterable[str], cli: Iterable[str], allow_failures: bool = False
) -> list[SLO]:
    """The recipe's and the command line's SLOs, plus `request_errors.failed<=0` unless failures are
    allowed or an explicit request_errors SLO is given."""
    slos = [parse_slo(t, "recipe bench.thresholds") for t in recipe_thresholds] + [
        parse_slo(t, "--slo") for t in cli
    ]
    if not allow_failures and not any(s.metric == "request_errors" for s in slos):
        slos.append(NO_FAILURES)
    return slos


def check(
    slos: Iterable[SLO], levels: dict[str, BenchLevel], accuracy: dict[str, TaskScore]
) -> list[SLOResult]:
    """Every SLO on every level (latency/throughput) or its task (accuracy); not measured counts as
    failed."""
    results: list[SLOResult] = []
    for slo in slos:
        if slo.metric == "request_errors":  # failed requests of the accuracy tasks count too
            for name, scored in accuracy.items():
                failed = float(scored.failed or 0)
                rate = failed / max(1, scored.total or 1)
                results.append(_one(slo, name, failed if slo.stat == "failed" else rate))
            if not levels:
                continue
        if slo.metric in ACCURACY_STATS:
            task = accuracy.get(slo.metric)
            results.append(_one(slo, slo.metric, getattr(task, slo.stat, None)))
            continue
        if not levels:
            results.append(_one(slo, "(no latency run)", None))
        for where, summary in levels.items():
            results.append(_one(slo, where, _level_value(slo, summary)))
    return results


def _level_value(slo: SLO, summary: BenchLevel) -> float | None:
    if slo.metric == "request_errors":
        counts = summary.request_count
        return (
            float(counts["failed"])
            if slo.stat == "failed"
            else counts["failed"] / max(1, counts["total"])
        )
    value = getattr(getattr(summary, slo.metric), slo.stat, None)
    return None if value is None else float(value)


def _one(slo: SLO, where: str, measured: float | None) -> SLOResult:
    ok = measured is not None and not math.isnan(measured) and OPS[slo.op](measured, slo.value)
    return SLOResult(slo, where, measured, ok)
