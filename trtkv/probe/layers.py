"""`trtkv probe RECIPE --per-layer FORMAT`: which layers carry the KV error, and which to keep in 16 bit.

Method (written into per_layer_<format>.md too):
- Sensitivity, at the sweep length (2,048 tokens, or the longest probe length when shorter), against the same
  fp16-KV reference as the probe: the KL (and top-1 agreement) when only layer i is quantized, and when every layer
  but i is (i kept in the model dtype, as vLLM's --kv-cache-dtype-skip-layers keeps it). gain(i) = KL(uniform) -
  KL(all but i): what keeping layer i buys.
- Search: greedy by gain; the set of the k best layers is predicted to reach KL(uniform) - sum of their gains
  (additive; interactions are real, so every recommended set is verified).
- Verification: one pass at the longest length for each candidate set, the uniform format and all-16-bit (one causal
  pass gives every shorter length's metrics), so predicted vs measured KL is reported at the sweep length and the
  measured KL at the longest.
- Front: bytes/token vs KL at the sweep and the longest length for the uniform format, all-16-bit and the mixed sets
  (plus the probe's other formats when probe.json has them at those lengths); non-dominated points are the front,
  by KL and by top-1 agreement.
- Recommendation: among every point of the front an engine serves (the recipe's own rules asked per backend and
  GPU: trtkv.probe.serving), the lowest KL at the longest length within the byte budget (--max-bytes-per-token;
  default 15% above the uniform format), or the fewest bytes under --max-kl; the best point no engine serves is
  named beside it, with the reason.
Passes are cached (cache/per_layer/) so a rerun or a new budget costs nothing.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trtkv.core.errors import TrtkvError
from trtkv.kvcache.cache import QuantizedKVCache
from trtkv.kvcache.formats import KVFormat, kv_bytes_per_token
from trtkv.kvcache.quant import FormatChoice, numerics_key, parse_format
from trtkv.probe.measure import feed, needle_trials, position_metrics, probe_scales, reference_hidden
from trtkv.probe.serving import KV_CACHE_OF_FORMAT, served_by, serving, usable_gpus
from trtkv.probe.setup import default_settings, load_model, write_json
from trtkv.probe.sweep import probe_output
from trtkv.recipe import Recipe

SWEEP_LEN = 2048
DEFAULT_BYTES_HEADROOM = 1.15  # the budget: at most 15% more bytes than the uniform format


def _stats_rows(scales: Any, n: int) -> list[dict[str, Any]]:
    stats = getattr(scales, "stats", None)
    rows = []
    for i in range(n):
        s = stats.layers[i] if stats and i < len(stats.layers) else None
        rows.append({} if s is None else {
            "k_amax": s.k_amax, "v_amax": s.v_amax, "k_over_v_range": s.k_amax / s.v_amax if s.v_amax else None,
            "k_outlier_channels": len(s.k_outlier_channels), "v_outlier_channels": len(s.v_outlier_channels),
            "k_tensor_to_channel_ratio": s.k_tensor_to_channel_ratio})
    return rows


def pareto(points: list[dict[str, Any]], key: str) -> list[str]:
    """Labels of the points no other point beats on both bytes and `key` (lower is better for both)."""
    front = []
    for p in points:
        if p.get(key) is None:
            continue
        dominated = any(q is not p and q.get(key) is not None and q["bytes_per_token"] <= p["bytes_per_token"]
                        and q[key] <= p[key] and (q["bytes_per_token"] < p["bytes_per_token"] or q[key] < p[key])
                        for q in points)
        if not dominated:
            front.append(p["label"])
    return front


def per_layer_key(model_key: str, choice: FormatChoice, scales: Any, keep_fmt: KVFormat) -> str:
    """The key of this sweep's cached passes: the model, the numerics of the format and of the kept layers' format
    (numerics_key, as the sweep's cache is keyed) and the static scales; a changed format definition misses."""
    affine = scales.affine.to_dict() if getattr(scales, "affine", None) is not None else None
    parts = [model_key, choice.name, numerics_key(choice), numerics_key(keep_fmt), scales.k_amax, scales.v_amax, affine]
    extra = scales.format_amaxes(choice) if hasattr(scales, "format_amaxes") else None
    if extra is not None:  # fp8_attn_head's per-head, nvfp4_rotate's rotated-K amax (other formats' keys unchanged)
        parts.append(extra)
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def run_per_layer(recipe: Recipe, fmt: str, output: Path | None = None, lengths: list[int] | None = None,
                  max_keep: int = 4, max_bytes_per_token: float | None = None, max_kl: float | None = None,
                  threads: int | None = None, needle_lengths: list[int] | None = None,
                  log: Callable[[str], None] = print) -> Path:
    choice = parse_format(fmt)
    if choice.base in (KVFormat.FP16, KVFormat.BF16) or choice.base.value.startswith("kivi"):
        raise TrtkvError(f"--per-layer {fmt}: pick a quantized per-token format (fp8, int8, int4_g64, nvfp4, ...); "
                         f"16-bit has nothing to keep and KIVI's window is a per-token, not per-layer, choice.")
    if max_keep < 1:
        raise TrtkvError(f"--max-keep {max_keep}: use 1 or more")
    out = probe_output(recipe, output)
    settings = default_settings(recipe, formats=[choice.name], lengths=lengths, needle_lengths=needle_lengths or [])
    settings.threads = threads
    longest = max(settings.lengths)
    sweep = min(SWEEP_LEN, longest)
    t_start = time.time()
    loaded = load_model(recipe, settings)
    scales = probe_scales(recipe, loaded, settings, out)
    n_layers = int(loaded.info["num_layers"])
    heads, dim = int(loaded.info["num_kv_heads"]), int(loaded.info["head_dim"])
    keep_fmt = recipe.kv_skip_format
    ref, _ref_bytes = reference_hidden(loaded, longest, out)
    targets = torch.tensor(loaded.text_ids[1:longest], device=loaded.device)
    ks, vs = scales.for_format(choice)
    skey = per_layer_key(loaded.key, choice, scales, keep_fmt)
    cache_dir = out / "cache" / "per_layer"
    passes = {"run": 0, "cached": 0}

    def measure(keep: list[int], n: int) -> dict[str, Any]:
        """KL/top-1 at every reported length <= n for `fmt` with `keep` in the model dtype (cached)."""
        name = hashlib.sha256(json.dumps([skey, sorted(keep), n]).encode()).hexdigest()[:20]
        path = cache_dir / f"{name}.json"
        if path.is_file():
            passes["cached"] += 1
            return dict(json.loads(path.read_text()))
        cache = QuantizedKVCache(loaded.model.config, choice, ks, vs, keep_layers=keep, keep_format=keep_fmt)
        ids = torch.tensor([loaded.text_ids[:n]], device=loaded.device)
        hidden = feed(loaded.model, ids, cache, None)[0]
        m = position_metrics(loaded.model, ref[: n - 1], hidden[: n - 1], targets[: n - 1])
        res: dict[str, Any] = {"keep": sorted(keep), "bytes_per_token": kv_bytes_per_token(
            n_layers, heads, dim, choice.base, keep, keep_fmt)}
        for length in sorted({sweep, longest, *settings.lengths}):
            if length <= n:
                res[str(length)] = {"kl": float(m["kl"][: length - 1].double().mean()),
                                    "top1": float(m["agree"][: length - 1].double().mean())}
        if choice.static and not keep:
            clip = cache.clip_stats()
            res["clip_by_layer"] = [(x["k_clip"] + x["v_clip"]) / x["elements"] if x["elements"] else 0.0
                                    for x in clip["layers"]]
        write_json(path, res)
        passes["run"] += 1
        return res

    def needle(keep: list[int], length: int) -> float:
        """Passkey accuracy at `length` for `fmt` with `keep` in the model dtype (cached)."""
        params = [skey, "needle", sorted(keep), length, settings.needle_depths, settings.needle_seeds]
        path = cache_dir / f"{hashlib.sha256(json.dumps(params).encode()).hexdigest()[:20]}.json"
        if path.is_file():
            passes["cached"] += 1
            return float(json.loads(path.read_text())["accuracy"])
        res = needle_trials(loaded, choice, scales, length, settings.needle_depths, settings.needle_seeds,
                            keep_layers=keep, keep_format=keep_fmt)
        write_json(path, {"params": params, "accuracy": res["accuracy"], "by_depth": res["by_depth"]})
        passes["run"] += 1
        return float(res["accuracy"])

    everything = list(range(n_layers))
    log(f"probe --per-layer {choice.name}: {2 * n_layers + 1} passes at {sweep} tokens, then up to {max_keep + 2} at "
        f"{longest}")
    uniform = measure([], sweep)
    rows = []
    for i in everything:
        only = measure([j for j in everything if j != i], sweep)
        but = measure([i], sweep)
        rows.append({"layer": i, "kl_only": only[str(sweep)]["kl"], "top1_only": only[str(sweep)]["top1"],
                     "kl_all_but": but[str(sweep)]["kl"], "top1_all_but": but[str(sweep)]["top1"],
                     "gain": uniform[str(sweep)]["kl"] - but[str(sweep)]["kl"]})
        if (i + 1) % 10 == 0:
            log(f"  layers 0..{i}: {passes['run']} passes run, {passes['cached']} from cache, "
                f"{time.time() - t_start:.0f} s")
    for row, st, clip in zip(rows, _stats_rows(scales, n_layers), uniform.get("clip_by_layer") or [None] * n_layers,
                             strict=True):
        row.update(st, clip_rate=clip)
    order = sorted(everything, key=lambda i: rows[i]["gain"], reverse=True)
    uniform_kl = uniform[str(sweep)]["kl"]
    # verification at the longest length
    long_uniform = measure([], longest)
    long_all16 = measure(everything, longest)
    candidates = []
    for k in range(1, max_keep + 1):
        keep = sorted(order[:k])
        predicted = max(0.0, uniform_kl - sum(rows[i]["gain"] for i in order[:k]))
        got = measure(keep, longest)
        candidates.append({"label": f"{choice.name}+{keep_fmt.value}{keep}", "keep": keep,
                           "bytes_per_token": got["bytes_per_token"], "predicted_kl_sweep": predicted,
                           "kl_sweep": got[str(sweep)]["kl"], "top1_sweep": got[str(sweep)]["top1"],
                           "kl_longest": got[str(longest)]["kl"], "top1_longest": got[str(longest)]["top1"],
                           "prediction_error": (predicted - got[str(sweep)]["kl"]) / got[str(sweep)]["kl"]
                           if got[str(sweep)]["kl"] else None})
    points = [{"label": choice.name, "keep": [], "bytes_per_token": long_uniform["bytes_per_token"],
               "kl_sweep": long_uniform[str(sweep)]["kl"], "kl_longest": long_uniform[str(longest)]["kl"],
               "top1_sweep": long_uniform[str(sweep)]["top1"], "top1_longest": long_uniform[str(longest)]["top1"]},
              {"label": keep_fmt.value, "keep": everything, "bytes_per_token": long_all16["bytes_per_token"],
               "kl_sweep": long_all16[str(sweep)]["kl"], "kl_longest": long_all16[str(longest)]["kl"],
               "top1_sweep": long_all16[str(sweep)]["top1"], "top1_longest": long_all16[str(longest)]["top1"]},
              *candidates, *_probe_points(out, choice.name, sweep, longest)]
    if settings.needle_lengths:
        log(f"  needle retrieval at {settings.needle_lengths} for {2 + len(candidates)} configurations")
        probe_needles = _probe_needles(out)
        for point in points:
            kept = everything if point is points[1] else point.get("keep")
            point["needle"] = {str(n): needle(kept, n) if kept is not None else probe_needles.get((point["label"], n))
                               for n in settings.needle_lengths}
    for point in points:  # which engines serve it (the recipe's own rules, per backend and GPU)
        fmt_name = keep_fmt.value if point is points[1] else (choice.name if point.get("keep") is not None
                                                                else point["label"])
        point["serving"] = serving(recipe, fmt_name, point.get("keep") if point is not points[1] else [])
    budget = max_bytes_per_token if max_bytes_per_token is not None else (
        None if max_kl is not None else DEFAULT_BYTES_HEADROOM * long_uniform["bytes_per_token"])
    eligible = [p for p in points
                if (budget is None or p["bytes_per_token"] <= budget) and (max_kl is None or p["kl_longest"] <= max_kl)]
    cheapest = max_kl is not None
    usable = usable_gpus([p["serving"] for p in points])
    best = _pick([p for p in eligible if p["serving"]["engines"]], cheapest)
    best_any = _pick(eligible, cheapest)
    doc = {"recipe": recipe.name, "format": choice.name, "keep_format": keep_fmt.value, "sweep_length": sweep,
           "longest_length": longest, "layers": rows, "order_by_gain": order, "uniform": points[0],
           "all_16bit": points[1], "candidates": candidates, "points": points,
           "front_sweep": pareto(points, "kl_sweep"), "front_longest": pareto(points, "kl_longest"),
           "front_longest_top1": pareto([{**p, "top1_miss": 1.0 - p["top1_longest"]} for p in points], "top1_miss"),
           "front_longest_served": pareto([p for p in points if p["serving"]["engines"]], "kl_longest"),
           "needle_lengths": settings.needle_lengths, "front_needle": _needle_front(points, settings.needle_lengths),
           "gpus_usable": usable,
           "budget": {"max_bytes_per_token": budget, "max_kl": max_kl}, "recommended": best,
           "best_not_served": best_any if best_any is not None and best_any is not best else None,
           "passes": passes, "seconds": round(time.time() - t_start, 1), "method": __doc__}
    if best is not None:
        doc["deploy"] = _deploy(best, choice.name, usable)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"per_layer_{choice.name}"
    write_json(stem.with_suffix(".json"), doc)
    stem.with_suffix(".md").write_text(markdown(doc))
    plot(doc, stem.with_suffix(".png"))
    log(f"probe --per-layer {choice.name}: wrote {stem}.json/.md/.png in {doc['seconds']:.0f} s "
        f"({passes['run']} passes, {passes['cached']} cached)")
    log(summary_line(doc))
    return stem.with_suffix(".json")


def _pick(points: list[dict[str, Any]], cheapest: bool = False) -> dict[str, Any] | None:
    """The lowest KL at the longest length (ties: fewer bytes); with cheapest, the fewest bytes (ties: lower KL)."""
    key = (lambda p: (p["bytes_per_token"], p["kl_longest"])) if cheapest else (
        lambda p: (p["kl_longest"], p["bytes_per_token"]))
    return min(points, key=key, default=None)


def _deploy(point: dict[str, Any], fmt: str, usable: list[str]) -> dict[str, Any]:
    """The recipe settings that deploy `point`, and the engines that serve it."""
    keep = point.get("keep")
    kv = KV_CACHE_OF_FORMAT.get(fmt if keep is not None else point["label"])
    out: dict[str, Any] = {"served_by": served_by(point["serving"], usable), "engines": point["serving"]["engines"]}
    if keep and kv is not None and kv.value != "none":
        out.update({"quantization.kv_cache": kv.value, "quantization.kv_skip_layers": keep,
                    "vllm": f"--kv-cache-dtype-skip-layers {' '.join(map(str, keep))}"})
    elif kv is not None:
        out["quantization.kv_cache"] = kv.value
    return out


def _needle_front(points: list[dict[str, Any]], lengths: list[int]) -> list[str]:
    """The bytes-vs-needle front at the longest needle length (points without a needle figure left out)."""
    if not lengths:
        return []
    n = str(max(lengths))
    rated = [{**p, "needle_miss": 1.0 - p["needle"][n]} for p in points if (p.get("needle") or {}).get(n) is not None]
    return pareto(rated, "needle_miss")


def _probe_needles(out: Path) -> dict[tuple[str, int], float]:
    """Needle accuracy per (format, length) from probe.json, for the other uniform formats."""
    from trtkv.contracts.artifacts import ProbeDoc

    try:
        probe = ProbeDoc.load(out)
    except TrtkvError:
        return {}
    rows = (probe.model_extra or {}).get("needles", []) if probe else []
    return {(r["format"], int(r["context_len"])): float(r["accuracy"]) for r in rows
            if isinstance(r, dict) and r.get("accuracy") is not None}


def _probe_points(out: Path, fmt: str, sweep: int, longest: int) -> list[dict[str, Any]]:
    """The probe's other uniform formats at the same two lengths (probe.json), for the front."""
    from trtkv.contracts.artifacts import ProbeDoc

    try:
        probe = ProbeDoc.load(out)
    except TrtkvError:
        return []
    by = {(r["format"], r["context_len"]): r for r in (probe.records if probe else [])}
    out_points = []
    for name in sorted({f for f, _ in by}):
        if name == fmt or (name, sweep) not in by or (name, longest) not in by:
            continue
        a, b = by[(name, sweep)], by[(name, longest)]
        out_points.append({"label": name, "keep": None, "bytes_per_token": a["kv_bytes_per_token_formula"],
                           "kl_sweep": a["kl_mean"], "kl_longest": b["kl_mean"], "top1_sweep": a["top1_agreement"],
                           "top1_longest": b["top1_agreement"], "source": "probe.json"})
    return out_points


def summary_line(doc: dict[str, Any]) -> str:
    """What to deploy within the budget (and what would be better if an engine served it)."""
    u, best, lng = doc["uniform"], doc["recommended"], doc["longest_length"]
    if best is None:
        return f"  no configuration an engine serves meets the budget {doc['budget']}"
    ratio = best["kl_longest"] / u["kl_longest"] if u["kl_longest"] else float("nan")
    cost = f"{best['bytes_per_token']:,.0f} B/token ({best['bytes_per_token'] / u['bytes_per_token'] - 1:+.1%} vs " \
           f"uniform {u['label']})"
    served = doc.get("deploy", {}).get("served_by", "")
    if best is u:
        line = (f"  recommended: uniform {u['label']} (nothing an engine serves within {doc['budget']} beats it: KL "
                f"{u['kl_longest']:.4g} at {lng}); served by {served}")
    elif best.get("keep"):
        line = (f"  recommended: keep layers {best['keep']} in {doc['keep_format']}: {cost}, KL at {lng} "
                f"{best['kl_longest']:.4g} = {ratio:.0%} of uniform's {u['kl_longest']:.4g}; deploy: "
                f"quantization.kv_skip_layers={best['keep']}, served by {served}")
    else:
        line = (f"  recommended: {best['label']}: {cost}, KL at {lng} {best['kl_longest']:.4g} = {ratio:.0%} of "
                f"uniform {u['label']}'s; deploy: quantization.kv_cache={doc['deploy'].get('quantization.kv_cache')}, "
                f"served by {served}")
    other = doc.get("best_not_served")
    if other is not None:
        line += (f"\n  better but served by no engine: {other['label']} ({other['bytes_per_token']:,.0f} B/token, KL at "
                 f"{lng} {other['kl_longest']:.4g}): {next(iter(other['serving']['why_not'].values()), '')}")
    return line


def markdown(doc: dict[str, Any]) -> str:
    s, lng = doc["sweep_length"], doc["longest_length"]
    lines = [f"# Per-layer KV precision: {doc['recipe']}, {doc['format']} (layers kept in {doc['keep_format']})", "",
             *(line.strip() for line in summary_line(doc).splitlines()), "",
             f"## Sensitivity at {s} tokens (KL to the fp16-KV reference)", "",
             "| layer | KL only this layer | KL all but this | gain | K/V range | K outlier ch. | clip rate |",
             "|---|---|---|---|---|---|---|"]
    for r in doc["layers"]:
        ratio = r.get("k_over_v_range")
        clip = r.get("clip_rate")
        lines.append(f"| {r['layer']} | {r['kl_only']:.3g} | {r['kl_all_but']:.3g} | {r['gain']:.3g} | "
                     f"{'' if ratio is None else f'{ratio:.1f}x'} | {r.get('k_outlier_channels', '')} | "
                     f"{'' if clip is None else f'{clip:.2e}'} |")
    lines += ["", f"## Configurations (verified at {lng} tokens; KL at {s} from the same pass)", "",
              f"| configuration | bytes/token | predicted KL@{s} | KL@{s} | KL@{lng} | top-1@{lng} | front: KL / top-1 / "
              f"KL among served | served by |", "|---|---|---|---|---|---|---|---|"]
    needle_n = str(max(doc["needle_lengths"])) if doc.get("needle_lengths") else None
    if needle_n:
        lines[-2] = lines[-2].replace(" | served by |", f" | needle@{needle_n} | served by |")
        lines[-1] += "---|"
    front, front1 = set(doc["front_longest"]), set(doc.get("front_longest_top1", []))
    served_front = set(doc.get("front_longest_served", []))
    for p in doc["points"]:
        pred = p.get("predicted_kl_sweep")
        marks = " / ".join("yes" if p["label"] in f else "no" for f in (front, front1, served_front))
        lines.append(f"| {p['label']} | {p['bytes_per_token']:,.0f} | {'' if pred is None else f'{pred:.4g}'} | "
                     f"{p['kl_sweep']:.4g} | {p['kl_longest']:.4g} | {p['top1_longest']:.4f} | {marks} | "
                     + (_fmt_needle((p.get("needle") or {}).get(needle_n)) + " | " if needle_n else "")
                     + f"{served_by(p.get('serving') or {}, doc.get('gpus_usable'))} |")
    if needle_n:
        lines += ["", f"Needle: passkey retrieval at {needle_n} tokens ({', '.join(doc.get('front_needle') or [])} on "
                      f"its bytes-vs-needle front); other formats' figures from probe.json where it has that length."]
    lines += ["", f"Served by: the engine backends whose rules (`trtkv build`'s) accept the configuration for this "
                  f"recipe, on every GPU where its model and weights run ({', '.join(doc.get('gpus_usable') or [])}) "
                  f"unless GPUs are named.", "",
              "## Method", "", doc["method"].strip(), ""]
    return "\n".join(lines)


def _fmt_needle(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = doc["layers"]
    xs = [r["layer"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    ax = axes[0]
    ax.bar([x - 0.2 for x in xs], [r["kl_only"] for r in rows], width=0.4, label="only this layer quantized")
    ax.bar([x + 0.2 for x in xs], [max(r["gain"], 0.0) for r in rows], width=0.4, label="gain from keeping it")
    ax.set(xlabel="layer", ylabel=f"KL @ {doc['sweep_length']}", title=f"{doc['format']}: per-layer sensitivity")
    ax.legend(fontsize=8)
    ax = axes[1]
    ax.plot(xs, [r.get("k_over_v_range") or 0 for r in rows], "o-", label="K range / V range")
    ax.plot(xs, [r.get("k_outlier_channels") or 0 for r in rows], "s-", label="K outlier channels")
    ax.set(xlabel="layer", title="K/V statistics (calibration pass)")
    if any(r.get("clip_rate") for r in rows):
        twin = ax.twinx()
        twin.plot(xs, [r.get("clip_rate") or 0 for r in rows], "^:", color="tab:red", label="clip rate")
        twin.set_ylabel("clip rate")
    ax.legend(fontsize=8)
    ax = axes[2]
    for p in doc["points"]:
        ax.scatter(p["bytes_per_token"], p["kl_longest"], label=p["label"])
    front = sorted((p for p in doc["points"] if p["label"] in doc["front_longest"]), key=lambda p: p["bytes_per_token"])
    ax.plot([p["bytes_per_token"] for p in front], [p["kl_longest"] for p in front], "k--", lw=0.8)
    ax.set(xlabel="KV bytes per token", ylabel=f"KL @ {doc['longest_length']}", yscale="log", title="front")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
