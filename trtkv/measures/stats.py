"""Summary statistics in GenAI-Perf's shape: avg, min, max, std, p50, p90, p95, p99."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

STATS = ("avg", "min", "max", "std", "p50", "p90", "p95", "p99")
PERCENTILES = {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0}


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """numpy's percentile (linear interpolation, GenAI-Perf's method); NaN for no values."""
    import numpy as np

    return (
        float(np.percentile(np.asarray(sorted_values, dtype=float), q))
        if len(sorted_values)
        else math.nan
    )


def summarize(values: Sequence[float]) -> dict[str, float | int]:
    """avg/min/max/std (population)/p50/p90/p95/p99 and the count; NaN for an empty input."""
    data = sorted(float(v) for v in values)
    n = len(data)
    if n == 0:
        return {"count": 0, **{s: math.nan for s in STATS}}
    avg = sum(data) / n
    std = math.sqrt(sum((v - avg) ** 2 for v in data) / n)
    out: dict[str, float | int] = {
        "count": n,
        "avg": avg,
        "min": data[0],
        "max": data[-1],
        "std": std,
    }
    for name, q in PERCENTILES.items():
        out[name] = percentile(data, q)
    return out


def wilson_interval(successes: float, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a proportion; (nan, nan) for n = 0. `successes` may be fractional (n
    times a mean of scores in [0, 1]): such a score's variance is at most p(1 - p), so the interval
    is then conservative."""
    if n <= 0:
        return math.nan, math.nan
    from statistics import NormalDist

    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = min(1.0, max(0.0, successes / n))
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (0.0 if p == 0.0 else max(0.0, centre - half)), (
        1.0 if p == 1.0 else min(1.0, centre + half)
    )


CONFIDENCE = 0.95  # every accuracy interval of `trtkv bench`
BOOTSTRAP_RESAMPLES = 2000


def bootstrap_interval(
    values: Sequence[float],
    confidence: float = CONFIDENCE,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile-bootstrap interval of the mean of `values` (e.g. per-prompt golden agreement),
    seeded: the same values give the same interval; (nan, nan) for none, (v, v) when all are
    equal."""
    data = [float(v) for v in values]
    if not data:
        return math.nan, math.nan
    if min(data) == max(data):
        return data[0], data[0]
    import numpy as np

    rng = np.random.default_rng(seed)
    arr = np.asarray(data)
    means = arr[rng.integers(0, len(arr), size=(resamples, len(arr)))].mean(axis=1)
    tail = (1.0 - confidence) / 2 * 100
    return float(np.percentile(means, tail)), float(np.percentile(means, 100 - tail))


def proportion(
    successes: int, n: int, confidence: float = CONFIDENCE
) -> dict[str, float | list[float]]:
    """A proportion with its Wilson interval, as results.json stores it: {"value", "ci",
    "confidence"}."""
    lo, hi = wilson_interval(successes, n, confidence)
    return {"value": successes / n if n else math.nan, "ci": [lo, hi], "confidence": confidence}


def separated(a: Sequence[float] | None, b: Sequence[float] | None) -> bool | None:
    """True when two intervals do not overlap (a difference worth calling), False when they do
    ("within noise"), None when either is missing or NaN."""
    if not a or not b or len(a) != 2 or len(b) != 2 or any(math.isnan(float(x)) for x in (*a, *b)):
        return None
    return float(a[1]) < float(b[0]) or float(b[1]) < float(a[0])


def interval_text(ci: Any) -> str:
    """ "[lo, hi]" of a stored interval, "—" when there is none (results written before intervals
    existed)."""
    if (
        not isinstance(ci, (list, tuple))
        or len(ci) != 2
        or any(not isinstance(x, (int, float)) for x in ci)
    ):
        return "—"
    return f"[{ci[0]:.3f}, {ci[1]:.3f}]"
