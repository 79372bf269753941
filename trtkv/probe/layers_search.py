"""The measured phases of `trtkv probe --per-layer` (trtkv.probe.layers, whose docstring is the
method): each layer's sensitivity at the sweep length, the candidate sets verified at the longest
length as the front's points (with their needles and the probe's other uniform formats from
probe.json), and the fronts: the points no other beats on both bytes and KL, top-1 or needle
misses."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtkv.core.errors import TrtkvError
from trtkv.probe.layer_passes import LayerPasses
from trtkv.probe.window import SLIDING


@dataclass(frozen=True)
class Sensitivity:
    """The sensitivity phase at the sweep length: per layer KL/top-1 with only it quantized and with
    all but it, the layers by gain, and the uniform format's pass."""

    rows: list[dict[str, Any]]
    order: list[int]
    uniform: dict[str, Any]
    sweep: int

    def predicted(self, keep: list[int]) -> float:
        """KL at the sweep length predicted for keeping `keep` (the gains added)."""
        return max(
            0.0, self.uniform[str(self.sweep)]["kl"] - sum(self.rows[i]["gain"] for i in keep)
        )


def _stats_rows(scales: Any, n: int) -> list[dict[str, Any]]:
    stats = getattr(scales, "stats", None)
    rows = []
    for i in range(n):
        s = stats.layers[i] if stats and i < len(stats.layers) else None
        rows.append(
            {}
            if s is None
            else {
                "k_amax": s.k_amax,
                "v_amax": s.v_amax,
                "k_over_v_range": s.k_amax / s.v_amax if s.v_amax else None,
                "k_outlier_channels": len(s.k_outlier_channels),
                "v_outlier_channels": len(s.v_outlier_channels),
                "k_tensor_to_channel_ratio": s.k_tensor_to_channel_ratio,
            }
        )
    return rows


def sensitivity(lp: LayerPasses) -> Sensitivity:
    """At the sweep length: the uniform format, each layer alone quantized and each layer alone
    kept; a layer's gain is what keeping it buys (KL uniform - KL all but it), with the
    calibration's statistics and clip rate."""
    everything, sweep = lp.everything, str(lp.sweep)
    sens = lp.measure(
        [[], *([j for j in everything if j != i] for i in everything), *([i] for i in everything)],
        lp.sweep,
    )
    uniform = sens[()]
    rows = []
    for i in everything:
        only = sens[tuple(j for j in everything if j != i)]
        but = sens[(i,)]
        rows.append(
            {
                "layer": i,
                "kl_only": only[sweep]["kl"],
                "top1_only": only[sweep]["top1"],
                "kl_all_but": but[sweep]["kl"],
                "top1_all_but": but[sweep]["top1"],
                "gain": uniform[sweep]["kl"] - but[sweep]["kl"],
                **(
                    {"attention": "sliding" if lp.kinds[i] == SLIDING else "full"}
                    if lp.window
                    else {}
                ),
            }
        )
    for row, st, clip in zip(
        rows,
        _stats_rows(lp.scales, lp.n_layers),
        uniform.get("clip_by_layer") or [None] * lp.n_layers,
        strict=True,
    ):
        row.update(st, clip_rate=clip)
    order = sorted(everything, key=lambda i: rows[i]["gain"], reverse=True)
    return Sensitivity(rows, order, uniform, lp.sweep)


def verified_points(
    lp: LayerPasses, sens: Sensitivity, max_keep: int, out: Path
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """Verification at the longest length: the uniform format, all-16-bit, the greedy sets (the k
    best layers, k up to max_keep) and, on a windowed model, the sliding layers kept (vLLM's
    `--kv-cache-dtype-skip-layers sliding_window`) and the full-attention layers kept; with the
    probe's other uniform formats, the front's points. Returns the points, the greedy candidates and
    the named sets."""
    choice, keep_fmt = lp.choice, lp.keep_fmt
    named = (
        {
            "sliding_window": lp.sliding,
            "full_attention": [i for i in lp.everything if i not in lp.sliding],
        }
        if lp.window
        else {}
    )
    greedy = [sorted(sens.order[:k]) for k in range(1, max_keep + 1)]
    got = lp.measure([[], lp.everything, *greedy, *named.values()], lp.longest)
    candidates = []
    for keep in greedy:
        c = _point(
            lp, got[tuple(keep)], f"{choice.name}+{keep_fmt.value}{keep}", keep, choice.name, keep
        )
        c["predicted_kl_sweep"] = sens.predicted(keep)
        c["prediction_error"] = (
            (c["predicted_kl_sweep"] - c["kl_sweep"]) / c["kl_sweep"] if c["kl_sweep"] else None
        )
        candidates.append(c)
    sets = {}
    for name, keep in named.items():
        same = next((c for c in candidates if c["keep"] == keep), None)
        if same is not None:  # the greedy search found it: one point, named
            same["set"] = name
            sets[name] = same
            continue
        skip: list[Any] = ["sliding_window"] if name == "sliding_window" else keep
        sets[name] = _point(
            lp, got[tuple(keep)], f"{choice.name}+{keep_fmt.value}[{name}]", keep, choice.name, skip
        )
        sets[name].update(set=name, predicted_kl_sweep=sens.predicted(keep))
    points = [
        _point(lp, got[()], choice.name, [], choice.name, []),
        _point(lp, got[tuple(lp.everything)], keep_fmt.value, lp.everything, keep_fmt.value, []),
        *candidates,
        *(p for p in sets.values() if p not in candidates),
        *_probe_points(out, choice.name, lp.sweep, lp.longest, lp.held),
    ]
    return points, candidates, sets


def _point(
    lp: LayerPasses,
    got: dict[str, Any],
    label: str,
    keep: list[int],
    fmt_name: str,
    skip: list[Any],
) -> dict[str, Any]:
    """One point of the front from its verification pass `got`: bytes held per token, KL and top-1
    per length."""
    lengths = list(map(str, sorted(lp.settings.lengths)))
    sweep, longest = str(lp.sweep), str(lp.longest)
    return {
        "label": label,
        "keep": keep,
        "skip": skip,
        "format": fmt_name,
        "bytes_per_token": lp.held(keep, got["bytes_per_token_formula"]),
        "bytes_per_token_formula": got["bytes_per_token_formula"],
        "stored_bytes_per_token": got["stored_bytes"] / lp.longest,
        "kl_sweep": got[sweep]["kl"],
        "top1_sweep": got[sweep]["top1"],
        "kl_longest": got[longest]["kl"],
        "top1_longest": got[longest]["top1"],
        "kl_by_length": {n: got[n]["kl"] for n in lengths if n in got},
        "top1_by_length": {n: got[n]["top1"] for n in lengths if n in got},
        "cpu_seconds": got.get("cpu_seconds"),
        **({"needles": got["needles"]} if "needles" in got else {}),
    }


def add_needles(lp: LayerPasses, points: list[dict[str, Any]], out: Path) -> None:
    """Each point's passkey accuracy per needle length: from probe.json for the other uniform
    formats, from the verification pass on a windowed model (trtkv.probe.needles), else a needle
    pass of its own (cached)."""
    lengths = lp.settings.needle_lengths
    lp.log(f"  needle retrieval at {lengths} for {len(points)} configurations")
    probe_needles = _probe_needles(out)
    for p in points:
        if p.get("source") == "probe.json":
            p["needle"] = {str(n): probe_needles.get((p["label"], n)) for n in lengths}
        elif lp.window:  # asked from the verification pass itself (trtkv.probe.needles)
            p["needle"] = {
                str(n): (p.get("needles") or {}).get(str(n), {}).get("accuracy") for n in lengths
            }
        else:
            p["needle"] = {str(n): lp.needle(p["keep"], n) for n in lengths}


def fronts(points: list[dict[str, Any]], needle_lengths: list[int]) -> dict[str, Any]:
    """The non-dominated points: bytes vs KL at the sweep and the longest length, vs top-1 misses,
    among the served points, and vs needle misses."""
    return {
        "front_sweep": pareto(points, "kl_sweep"),
        "front_longest": pareto(points, "kl_longest"),
        "front_longest_top1": pareto(
            [{**p, "top1_miss": 1.0 - p["top1_longest"]} for p in points], "top1_miss"
        ),
        "front_longest_served": pareto(
            [p for p in points if p["serving"]["engines"]], "kl_longest"
        ),
        "needle_lengths": needle_lengths,
        "front_needle": _needle_front(points, needle_lengths),
    }


def pareto(points: list[dict[str, Any]], key: str) -> list[str]:
    """Labels of the points no other point beats on both bytes and `key` (lower is better for
    both)."""
    front = []
    for p in points:
        if p.get(key) is None:
            continue
        dominated = any(
            q is not p
            and q.get(key) is not None
            and q["bytes_per_token"] <= p["bytes_per_token"]
            and q[key] <= p[key]
            and (q["bytes_per_token"] < p["bytes_per_token"] or q[key] < p[key])
            for q in points
        )
        if not dominated:
            front.append(p["label"])
    return front


def _needle_front(points: list[dict[str, Any]], lengths: list[int]) -> list[str]:
    """The bytes-vs-needle front at the longest needle length (points without a needle figure left
    out)."""
    if not lengths:
        return []
    n = str(max(lengths))
    rated = [
        {**p, "needle_miss": 1.0 - p["needle"][n]}
        for p in points
        if (p.get("needle") or {}).get(n) is not None
    ]
    return pareto(rated, "needle_miss")


def _probe_needles(out: Path) -> dict[tuple[str, int], float]:
    """Needle accuracy per (format, length) from probe.json, for the other uniform formats."""
    from trtkv.contracts.probe_doc import ProbeDoc

    try:
        probe = ProbeDoc.load(out)
    except TrtkvError:
        return {}
    return {(r.format, r.context_len): r.accuracy for r in (probe.needles if probe else [])}


def _probe_points(
    out: Path, fmt: str, sweep: int, longest: int, held: Callable[[list[int] | None, float], float]
) -> list[dict[str, Any]]:
    """The probe's other uniform formats at the same two lengths (probe.json), for the front;
    `held`: the KV bytes per token a `longest`-token sequence holds, from the per-token formula (a
    windowed model's sliding layers hold their window only)."""
    from trtkv.contracts.probe_doc import ProbeDoc

    try:
        probe = ProbeDoc.load(out)
    except TrtkvError:
        return []
    by = {(r.format, r.context_len): r for r in (probe.records if probe else [])}
    out_points: list[dict[str, Any]] = []
    for name in sorted({f for f, _ in by}):
        if name == fmt or (name, sweep) not in by or (name, longest) not in by:
            continue
        a, b = by[(name, sweep)], by[(name, longest)]
        formula = a.kv_bytes_per_token_formula
        out_points.append(
            {
                "label": name,
                "keep": None,
                "skip": [],
                "format": name,
                "bytes_per_token": held(None, formula),
                "bytes_per_token_formula": formula,
                "kl_sweep": a.kl_mean,
                "kl_longest": b.kl_mean,
                "top1_sweep": a.top1_agreement,
                "top1_longest": b.top1_agreement,
                "source": "probe.json",
            }
        )
    return out_points
