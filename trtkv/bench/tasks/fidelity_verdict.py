"""The fidelity task's per-length table: per-token figures, bootstrap intervals, the verdict rule
and its text.

Per continuation position, the served engine and the prediction are each compared with the reference
(top-1 agreement, mean |delta log p|, KL over the served top-k); per length, token-pooled means get
95 % bootstrap intervals over documents and the paired served - predicted gap is judged (RULE).
trtkv.bench.tasks.fidelity runs the task.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from trtkv.bench.tasks.fidelity_score import Scored, Served
from trtkv.measures.stats import CONFIDENCE

BOOTSTRAP = 1000
METRICS = ("top1_agreement", "mean_abs_dlogp", "kl_topk")
# served - predicted, positive = worse
WORSE_SIGN = {"top1_agreement": -1.0, "mean_abs_dlogp": 1.0, "kl_topk": 1.0}
AS_PREDICTED, WORSE, NOT_MEASURED = "as predicted", "worse than the format predicts", "not measured"
RULE = (
    "worse when the 95% paired-bootstrap interval of served - predicted (oriented: positive = "
    "worse) clears zero by more than the half-width of the prediction's own interval, on any metric"
)


# ----------------------------------------------------------------------------- per-document figures


def _kl_topk(engine_top: dict[int, float], ref_at: dict[int, float]) -> float:
    tokens = list(engine_top)
    p = _softmax([engine_top[t] for t in tokens])
    q = _softmax([ref_at[t] for t in tokens])
    return sum(pi * (math.log(pi) - math.log(qi)) for pi, qi in zip(p, q, strict=True) if pi > 0)


def _softmax(lps: Sequence[float]) -> list[float]:
    top = max(lps)
    e = [math.exp(x - top) for x in lps]
    s = sum(e)
    return [x / s for x in e]


def served_rows(served: Served, ref: Scored) -> dict[str, list[float]]:
    """Per continuation position: the served engine vs the reference."""
    return _rows(served.ids, served.logprobs, served.top, ref)


def predicted_rows(served: Served, pred: Scored, ref: Scored) -> dict[str, list[float]]:
    """Per continuation position: the prediction vs the reference, on the same tokens."""
    return _rows(pred.argmax, pred.chosen, None if served.top is None else pred.top, ref)


def _rows(
    ids: list[int], chosen: list[float], top: list[dict[int, float]] | None, ref: Scored
) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {
        "top1_agreement": [float(t == a) for t, a in zip(ids, ref.argmax, strict=True)],
        "mean_abs_dlogp": [abs(c - r) for c, r in zip(chosen, ref.chosen, strict=True)],
    }
    if top is not None and ref.at is not None:
        out["kl_topk"] = [_kl_topk(t, r) for t, r in zip(top, ref.at, strict=True)]
    return out


# ----------------------------------------------------------------------------- bootstrap and
# verdict


def bootstrap(
    served: list[list[float]], predicted: list[list[float]], seed: int = 0
) -> dict[str, Any]:
    """Token-pooled means over documents with percentile intervals; the paired served - predicted
    difference."""
    import numpy as np

    sums_s = np.array([sum(d) for d in served], dtype=float)
    sums_p = np.array([sum(d) for d in predicted], dtype=float)
    counts = np.array([len(d) for d in served], dtype=float)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(counts), size=(BOOTSTRAP, len(counts)))
    n = counts[idx].sum(1)
    n[n == 0] = 1.0
    s, p = sums_s[idx].sum(1) / n, sums_p[idx].sum(1) / n
    lo_q, hi_q = (1 - CONFIDENCE) / 2, 1 - (1 - CONFIDENCE) / 2

    def figure(values: Any, point: float) -> dict[str, Any]:
        return {
            "value": point,
            "ci": [float(np.quantile(values, lo_q)), float(np.quantile(values, hi_q))],
        }

    total = max(1.0, float(counts.sum()))
    return {
        "served": figure(s, float(sums_s.sum() / total)),
        "predicted": figure(p, float(sums_p.sum() / total)),
        "gap": figure(s - p, float((sums_s.sum() - sums_p.sum()) / total)),
    }


def judge(metric: str, fig: dict[str, Any]) -> tuple[bool, float]:
    """(worse, margin): worse when the oriented gap interval clears zero by more than the
    prediction's half-width."""
    sign = WORSE_SIGN[metric]
    lo, hi = fig["gap"]["ci"]
    oriented_lo = min(sign * lo, sign * hi)
    margin = (fig["predicted"]["ci"][1] - fig["predicted"]["ci"][0]) / 2
    return oriented_lo > margin, margin


def length_summary(
    length: int,
    rows: list[tuple[dict[str, list[float]], dict[str, list[float]]]],
    skipped: dict[str, int],
) -> dict[str, Any]:
    """One length's table row: figures, gaps, margins and the verdict."""
    out: dict[str, Any] = {
        "length": length,
        "documents": len(rows),
        **skipped,
        "tokens": sum(len(s["top1_agreement"]) for s, _ in rows),
    }
    if not rows:
        return {**out, "verdict": NOT_MEASURED, "worse_metrics": []}
    worse = []
    for metric in METRICS:
        if any(metric not in s for s, _ in rows):
            out[metric] = None
            continue
        fig = bootstrap([s[metric] for s, _ in rows], [p[metric] for _, p in rows])
        bad, margin = judge(metric, fig)
        out[metric] = {**fig, "margin": margin, "worse": bad}
        if bad:
            worse.append(metric)
    return {**out, "verdict": WORSE if worse else AS_PREDICTED, "worse_metrics": worse}


def notes(table: list[dict[str, Any]]) -> list[str]:
    """The table as results.md lines (served vs predicted per length)."""

    def fmt(fig: dict[str, Any] | None, side: str) -> str:
        if not fig:
            return "-"
        lo, hi = fig[side]["ci"]
        return f"{fig[side]['value']:.3f} [{lo:.3f}, {hi:.3f}]"

    lines = []
    for r in table:
        if r["verdict"] == NOT_MEASURED:
            lines.append(f"length {r['length']}: not measured {r.get('note', '')}".rstrip())
            continue
        parts = [
            f"{m} served {fmt(r.get(m), 'served')} vs predicted {fmt(r.get(m), 'predicted')}"
            for m in METRICS
            if r.get(m)
        ]
        lines.append(
            f"length {r['length']} ({r['documents']} docs, {r['tokens']} tokens): {r['verdict']}; "
            + "; ".join(parts)
        )
    return lines
