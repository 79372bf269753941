"""Summary statistics in GenAI-Perf's shape: avg, min, max, std, p50, p90, p95, p99."""

from __future__ import annotations

import math
from collections.abc import Sequence

STATS = ("avg", "min", "max", "std", "p50", "p90", "p95", "p99")
PERCENTILES = {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0}


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """numpy's percentile (linear interpolation, GenAI-Perf's method); NaN for no values."""
    import numpy as np

    return float(np.percentile(np.asarray(sorted_values, dtype=float), q)) if len(sorted_values) else math.nan


def summarize(values: Sequence[float]) -> dict[str, float | int]:
    """avg/min/max/std (population)/p50/p90/p95/p99 and the count; NaN for an empty input."""
    data = sorted(float(v) for v in values)
    n = len(data)
    if n == 0:
        return {"count": 0, **{s: math.nan for s in STATS}}
    avg = sum(data) / n
    std = math.sqrt(sum((v - avg) ** 2 for v in data) / n)
    out: dict[str, float | int] = {"count": n, "avg": avg, "min": data[0], "max": data[-1], "std": std}
    for name, q in PERCENTILES.items():
        out[name] = percentile(data, q)
    return out


def wilson_interval(successes: float, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a proportion; (nan, nan) for n = 0. `successes` may be fractional (n times a mean of
    scores in [0, 1]): such a score's variance is at most p(1 - p), so the interval is then conservative."""
    if n <= 0:
        return math.nan, math.nan
    from statistics import NormalDist

    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = min(1.0, max(0.0, successes / n))
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (0.0 if p == 0.0 else max(0.0, centre - half)), (1.0 if p == 1.0 else min(1.0, centre + half))
