"""`trtkv bench --sweep-input`: latency against context length, and where a quantized KV cache
starts to pay.

At each input length the latency levels run as usual; per level this module keeps every request's
TTFT and mean ITL, fits ITL = slope x input + intercept (least squares, as vLLM's FP8 KV write-up
does) and TTFT linear and, with three lengths or more, quadratic; `trtkv compare` of two recipes
that differ in KV format then reports the break-even length, where the second recipe's ITL line
crosses below the first's, with a 95% percentile-bootstrap interval (requests resampled within each
length, 2000 resamples, seed 0: the same data always give the same interval), or says "never within
the measured range".
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0


def request_figures(records: Sequence[Any]) -> dict[str, list[float]]:
    """Per successful request: TTFT (ms) and its token-weighted mean inter-token latency (ms), as
    the level's own figures count them (RequestRecord.ttft_ms / itl_ms)."""
    ttft, itl = [], []
    for rec in records:
        if not rec.ok:
            continue
        t, i = rec.ttft_ms(), rec.itl_ms()
        if t is not None:
            ttft.append(round(t, 4))
        if i is not None:
            itl.append(round(i, 4))
    return {"ttft_ms": ttft, "itl_ms": itl}


def linear_fit(x: Sequence[float], y: Sequence[float]) -> dict[str, float] | None:
    """Least squares y = slope x + intercept, with R^2; None with fewer than two distinct x."""
    if len(set(x)) < 2:
        return None
    mx, my = statistics.fmean(x), statistics.fmean(y)
    sxx = sum((a - mx) ** 2 for a in x)
    slope = sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True)) / sxx
    intercept = my - slope * mx
    ss_tot = sum((b - my) ** 2 for b in y)
    ss_res = sum((b - slope * a - intercept) ** 2 for a, b in zip(x, y, strict=True))
    return {"slope": slope, "intercept": intercept, "r2": 1 - ss_res / ss_tot if ss_tot else 1.0}


def quadratic_fit(x: Sequence[float], y: Sequence[float]) -> dict[str, float] | None:
    """Least squares y = a x^2 + b x + c (normal equations, 3 x 3); None with fewer than three
    distinct x."""
    if len(set(x)) < 3:
        return None
    s = [sum(v**k for v in x) for k in range(5)]
    t = [sum(b * a**k for a, b in zip(x, y, strict=True)) for k in range(3)]
    m = [[s[4], s[3], s[2], t[2]], [s[3], s[2], s[1], t[1]], [s[2], s[1], s[0], t[0]]]
    for i in range(3):  # Gauss-Jordan with partial pivoting
        p = max(range(i, 3), key=lambda r: abs(m[r][i]))
        m[i], m[p] = m[p], m[i]
        if m[i][i] == 0:
            return None
        for r in range(3):
            if r != i:
                f = m[r][i] / m[i][i]
                m[r] = [a - f * b for a, b in zip(m[r], m[i], strict=True)]
    return {"a": m[0][3] / m[0][0], "b": m[1][3] / m[1][1], "c": m[2][3] / m[2][2]}


def _points(
    samples: dict[int, dict[str, list[float]]], key: str
) -> tuple[list[float], list[float]]:
    """One point per length: the median of that length's requests (robust to one slow request)."""
    xs, ys = [], []
    for n in sorted(samples):
        vals = samples[n].get(key) or []
        if vals:
            xs.append(float(n))
            ys.append(statistics.median(vals))
    return xs, ys


def fits(samples: dict[int, dict[str, list[float]]]) -> dict[str, Any]:
    """ITL and TTFT against input length for one level: the points (medians) and the fitted
    lines."""
    xi, yi = _points(samples, "itl_ms")
    xt, yt = _points(samples, "ttft_ms")
    return {
        "input_tokens": xi,
        "itl_p50_ms": yi,
        "itl_fit": linear_fit(xi, yi),
        "ttft_input_tokens": xt,
        "ttft_p50_ms": yt,
        "ttft_fit": linear_fit(xt, yt),
        "ttft_quadratic_fit": quadratic_fit(xt, yt),
    }


CLIENT_KEYS = ("workers", "decided", "cpu_cores", "cpu_us_per_token", "lag_ms", "warning")


def summarize(
    by_length: Mapping[int, Mapping[str, Sequence[Any]]],
    clients: Mapping[int, Mapping[str, Mapping[str, Any]]] | None = None,
) -> dict[str, Any]:
    """results.json's `sweep` (trtkv.contracts.BenchSweep); `clients`: client_summary per length and
    level (trtkv.bench.load.levels: a length the client held back says so)."""
    levels: dict[str, Any] = {}
    for n in sorted(by_length):
        for label, recs in by_length[n].items():
            body = levels.setdefault(label, {"samples": {}})
            body["samples"][str(n)] = request_figures(recs)
            got = (clients or {}).get(n, {}).get(label)
            if got is not None:
                body.setdefault("client", {})[str(n)] = {k: got[k] for k in CLIENT_KEYS if k in got}
    for body in levels.values():
        body.update(fits({int(k): v for k, v in body["samples"].items()}))
    return {
        "input_tokens": sorted(by_length),
        "levels": levels,
        "fit": "ITL = slope x input_tokens + intercept over each length's median (ms, ms/token); "
        "TTFT linear and quadratic likewise",
    }


def _crossing(a: dict[str, float] | None, b: dict[str, float] | None) -> float | None:
    """Input length where line b's ITL equals line a's (None: parallel)."""
    if not a or not b or a["slope"] == b["slope"]:
        return None
    return (b["intercept"] - a["intercept"]) / (a["slope"] - b["slope"])


# the two lines' crossing lies outside the measured lengths, but its 95% interval reaches into them:
# the data do not tell which is faster there (flat, noisy ITLs)
UNRESOLVED = "not resolved within the measured range"


def break_even(base: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """Where `other`'s fitted ITL drops below `base`'s, within the lengths both measured, with a
    bootstrap interval.

    Each argument is one level of results.json's sweep (`samples` per length). Returns {"tokens",
    "interval", "verdict"}: verdict "break-even", "faster over the whole measured range", "slower
    over the whole measured range" (= never within the measured range), UNRESOLVED (the crossing's
    interval reaches into the range) or "no fit".
    """
    sa, sb = _samples(base), _samples(other)
    common = sorted(set(sa) & set(sb))
    if len(common) < 2:
        return {
            "tokens": None,
            "interval": None,
            "verdict": "no fit (fewer than two common input lengths)",
        }
    lo, hi = common[0], common[-1]
    fa, fb = (
        fits({n: sa[n] for n in common})["itl_fit"],
        fits({n: sb[n] for n in common})["itl_fit"],
    )
    x = _crossing(fa, fb)
    verdict = _verdict(fa, fb, x, lo, hi)
    rng = random.Random(BOOTSTRAP_SEED)
    draws = []
    for _ in range(BOOTSTRAP_RESAMPLES):
        ra = {n: {"itl_ms": _resample(rng, sa[n]["itl_ms"])} for n in common}
        rb = {n: {"itl_ms": _resample(rng, sb[n]["itl_ms"])} for n in common}
        c = _crossing(fits(ra)["itl_fit"], fits(rb)["itl_fit"])
        draws.append(c if c is not None else float("inf"))
    draws.sort()
    interval = [draws[int(0.025 * len(draws))], draws[int(0.975 * len(draws)) - 1]]
    if verdict not in ("break-even", "no fit") and interval[0] <= hi and interval[1] >= lo:
        # the fits cross outside, but the resampled crossings reach into the range
        verdict = UNRESOLVED
    return {
        "tokens": x if verdict == "break-even" else None,
        "crossing_tokens": x,
        "interval": interval,
        "measured_range": [lo, hi],
        "verdict": verdict,
        "base_fit": fa,
        "other_fit": fb,
    }


def _samples(level: dict[str, Any]) -> dict[int, dict[str, list[float]]]:
    return {int(k): v for k, v in (level.get("samples") or {}).items() if v.get("itl_ms")}


def _resample(rng: random.Random, values: list[float]) -> list[float]:
    return [values[rng.randrange(len(values))] for _ in values]


def _verdict(
    fa: dict[str, float] | None, fb: dict[str, float] | None, x: float | None, lo: float, hi: float
) -> str:
    if not fa or not fb:
        return "no fit"
    if x is not None and lo <= x <= hi:
        return "break-even"
    at_lo = (fb["slope"] - fa["slope"]) * lo + fb["intercept"] - fa["intercept"]
    return (
        "faster over the whole measured range" if at_lo < 0 else "never within the measured range"
    )


def break_even_text(name_base: str, name_other: str, be: dict[str, Any]) -> str:
    """One line for compare.md and the console."""
    lo, hi = be.get("measured_range") or (None, None)
    ci = be.get("interval")
    ci_text = (
        f" (95% interval {ci[0]:,.0f} to {ci[1]:,.0f})"
        if ci and all(abs(v) != float("inf") for v in ci)
        else ""
    )
    if be["verdict"] == "break-even":
        return (
            f"{name_other} ITL drops below {name_base}'s at ~{be['tokens']:,.0f} input "
            f"tokens{ci_text}"
        )
    if be["verdict"].startswith("faster"):
        return (
            f"{name_other} is faster than {name_base} over the whole measured range "
            f"({lo:,}-{hi:,} tokens)"
        )
    if be["verdict"].startswith("never"):
        cross = be.get("crossing_tokens")
        beyond = f"; the fitted lines cross at ~{cross:,.0f} tokens" if cross and cross > 0 else ""
        return (
            f"{name_other} vs {name_base}: never within the measured range ({lo:,}-{hi:,} "
            f"tokens){beyond}{ci_text}"
        )
    if be["verdict"] == UNRESOLVED:
        return (
            f"{name_other} vs {name_base}: not resolved within the measured range ({lo:,}-{hi:,} "
            "tokens): the fitted lines cross outside it, but the crossing's 95% interval reaches "
            f"into it{ci_text}"
        )
    return f"{name_other} vs {name_base}: {be['verdict']}"
