"""Summary statistics match numpy's definitions (population std, linear percentiles)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trtkv.measures.stats import STATS, summarize

CASES = [[5.0], [1.0, 2.0], [3.0, 1.0, 2.0, 10.0, 7.5], list(np.random.default_rng(0).gamma(2, 30, 257))]


@pytest.mark.parametrize("values", CASES)
def test_summarize_matches_numpy(values: list[float]) -> None:
    s = summarize(values)
    arr = np.asarray(values)
    assert s["count"] == len(values)
    assert s["avg"] == pytest.approx(arr.mean())
    assert s["min"] == arr.min() and s["max"] == arr.max()
    assert s["std"] == pytest.approx(arr.std())
    for name, q in (("p50", 50), ("p90", 90), ("p95", 95), ("p99", 99)):
        assert s[name] == pytest.approx(np.percentile(arr, q))


def test_empty_is_nan_with_count_zero() -> None:
    s = summarize([])
    assert s["count"] == 0
    assert all(math.isnan(s[k]) for k in STATS)
