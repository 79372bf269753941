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
- A sliding-window hybrid (Gemma 3): every pass is the sweep's window-aware pass (trtkv.probe.window: a sliding
  layer keeps its window, chunked prefill, the last layer at the scored rows only), scored at the sweep's sampled
  LM-head rows (at the sweep length: SENSITIVITY_ROWS evenly spaced rows), one reference head shared by all the passes
  of a phase; the needles ride in the verification passes' text (trtkv.probe.needles). Two more verified sets: the
  sliding layers kept (`quantization.kv_skip_layers: [sliding_window]`, vLLM's `--kv-cache-dtype-skip-layers
  sliding_window`) and the full-attention layers kept. Bytes are those a sequence of the longest length holds, per
  token (a sliding layer holds its window: trtkv.recipe.attention), so the front prices a 16-bit sliding layer at
  what it costs there.
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
from trtkv.kvcache.formats import KVFormat, kv_bytes_per_token
from trtkv.kvcache.quant import FormatChoice, numerics_key, parse_format
from trtkv.probe.layers_report import markdown, plot, summary_line
from trtkv.probe.measure import (
    chunk_for,
    head_metrics,
    head_positions,
    make_cache,
    needle_trials,
    probe_scales,
    reference_hidden,
)
from trtkv.probe.needles import feed_text
from trtkv.probe.passes import feed
from trtkv.probe.serving import KV_CACHE_OF_FORMAT, served_by, serving, usable_gpus
from trtkv.probe.setup import default_settings, load_model, write_json
from trtkv.probe.sweep import probe_output
from trtkv.probe.window import SLIDING, layer_types, sliding_window
from trtkv.recipe import Recipe
from trtkv.recipe.attention import AttentionKind, LayerAttention

SWEEP_LEN = 2048
SENSITIVITY_ROWS = 512  # a windowed model's sensitivity passes: LM-head rows per pass (evenly spaced)
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


def _sensitivity_stride(sweep: int, long_stride: int) -> int:
    """The sensitivity rows' stride at the sweep length: at least SENSITIVITY_ROWS rows; a divisor of the longest
    pass's stride where one is near (then the verification passes, which score both sets, add no head rows below the
    sweep length)."""
    wanted = max(1, -(-(sweep - 1) // SENSITIVITY_ROWS))
    near = max(d for d in range(1, min(wanted, long_stride) + 1) if long_stride % d == 0)
    return near if 2 * near >= wanted else wanted


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
                  log: Callable[[str], None] = print, sweep_length: int | None = None) -> Path:
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
    sweep = min(sweep_length or SWEEP_LEN, longest)
    t_start, c_start = time.time(), time.process_time()
    loaded = load_model(recipe, settings)
    scales = probe_scales(recipe, loaded, settings, out)
    config = loaded.model.config
    n_layers = int(loaded.info["num_layers"])
    heads, dim = int(loaded.info["num_kv_heads"]), int(loaded.info["head_dim"])
    keep_fmt = recipe.kv_skip_format
    window = sliding_window(config)
    kinds = layer_types(config)
    sliding = [i for i, k in enumerate(kinds) if k == SLIDING]
    everything = list(range(n_layers))
    cache_dir = out / "cache" / "per_layer"
    passes = {"run": 0, "cached": 0}
    # the rows (position t predicts t + 1) each pass scores: every row of a full-attention model; on a windowed model
    # the sweep's sampled LM-head rows at the longest length and SENSITIVITY_ROWS evenly spaced ones at the sweep
    # length (a 262K-wide head per pass would cost more than the pass)
    rows_long = rows_sweep = None
    if window:
        rows_long = head_positions(loaded, longest - 1)
        rows_long = torch.arange(longest - 1) if rows_long is None else rows_long
        rows_sweep = rows_long if sweep == longest else torch.arange(0, sweep - 1, _sensitivity_stride(
            sweep, int(rows_long[1] - rows_long[0]) if rows_long.numel() > 1 else 1))
        union = torch.unique(torch.cat([rows_long, rows_sweep]))  # a verification pass scores both
        ref, _ = reference_hidden(loaded, longest, cache_dir, union)  # its own file: the sweep's stays valid
    else:
        union = None
        ref, _ = reference_hidden(loaded, longest, out)
    targets = torch.tensor(loaded.text_ids[1:longest], device=loaded.device)
    skey = per_layer_key(loaded.key, choice, scales, keep_fmt)
    all_key = hashlib.sha256(json.dumps([loaded.key, numerics_key(keep_fmt)]).encode()).hexdigest()[:16]

    def rows_at(n: int) -> torch.Tensor | None:
        return None if not window else (union if n == longest else rows_sweep)

    def scored(pos: torch.Tensor, length: int) -> torch.Tensor:
        """The rows a length's figures average: KL@sweep over the sensitivity rows in every pass (so predicted and
        verified KL at the sweep length are over the same positions), the other lengths over the sweep's rows."""
        sel = pos < length - 1
        if window and rows_sweep is not None and rows_long is not None:
            sel &= torch.isin(pos, rows_sweep if length == sweep else rows_long)
        return sel

    def pass_path(keep: tuple[int, ...], n: int, rows: torch.Tensor | None) -> Path:
        """Cached pass: all-16-bit is the same pass for every format (keyed without it)."""
        parts: list[Any] = [all_key, "all"] if list(keep) == everything else [skey, list(keep)]
        parts += [n, None if rows is None else rows.tolist()]
        return cache_dir / f"{hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:20]}.json"

    def measure(keeps: list[list[int]], n: int) -> dict[tuple[int, ...], dict[str, Any]]:
        """KL/top-1 at every reported length <= n for `fmt` with each `keep` in the model dtype: one pass each (cached;
        on a windowed model chunked, sliding layers windowed, the last layer at the scored rows only, and at the
        longest length the needles asked on the way), then ONE shared reference LM head for the new passes."""
        rows = rows_at(n)
        found: dict[tuple[int, ...], dict[str, Any]] = {}
        pending: dict[tuple[int, ...], tuple[torch.Tensor, dict[str, Any], Path]] = {}
        for keep in keeps:
            key = tuple(sorted(keep))
            path = pass_path(key, n, rows)
            if key in found or key in pending:
                continue
            if path.is_file():
                passes["cached"] += 1
                found[key] = dict(json.loads(path.read_text()))
                continue
            partial = path.with_suffix(".pt")  # a pass whose head had not run yet (an interrupted run)
            if partial.is_file():
                doc = torch.load(partial, weights_only=True)
                pending[key] = (doc["hidden"].to(loaded.device), dict(doc["res"]), path)
                continue
            t0, c0 = time.time(), time.process_time()
            cache = make_cache(loaded, choice, scales, keep_layers=list(key), keep_format=keep_fmt)
            ids = torch.tensor([loaded.text_ids[:n]], device=loaded.device)
            if window and n == longest:
                hidden, needles = feed_text(loaded, ids, cache, chunk_for(choice), rows)
            else:
                hidden, needles = feed(loaded.model, ids, cache, chunk_for(choice), rows), None
            hidden = hidden[0] if rows is not None else hidden[0, : n - 1]
            res: dict[str, Any] = {"keep": list(key), "bytes_per_token_formula": kv_bytes_per_token(
                n_layers, heads, dim, choice.base, list(key), keep_fmt), "stored_bytes": cache.stored_bytes(),
                "tokens": n, "seconds": round(time.time() - t0, 1), "cpu_seconds": round(time.process_time() - c0, 1)}
            if needles:
                res["needles"] = {str(length): {"accuracy": r["accuracy"], "by_depth": r["by_depth"]}
                                  for length, r in needles.items()}
            if choice.static and not key:
                clip = cache.clip_stats()
                res["clip_by_layer"] = [(x["k_clip"] + x["v_clip"]) / x["elements"] if x["elements"] else 0.0
                                        for x in clip["layers"]]
            del cache
            partial.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"hidden": hidden.cpu(), "res": res}, partial)
            pending[key] = (hidden, res, path)
            if len(pending) % 10 == 0:
                log(f"  {len(pending)} passes at {n} tokens run, {passes['cached']} from cache, "
                    f"{time.time() - t_start:.0f} s")
        if pending:
            if rows is None or union is None:  # rows and union are set together (a windowed model)
                ref_rows, tgt, pos = ref[: n - 1], targets[: n - 1], torch.arange(n - 1)
            else:
                ref_rows, tgt, pos = ref[torch.searchsorted(union, rows)], targets[rows.to(targets.device)], rows
            t0, c0 = time.time(), time.process_time()
            metrics = head_metrics(loaded.model, ref_rows, {str(k): h for k, (h, _, _) in pending.items()}, tgt)
            head_cpu = round((time.process_time() - c0) / len(pending), 1)
            for key, (_, res, path) in pending.items():
                m = metrics[str(key)]
                for length in sorted({sweep, longest, *settings.lengths}):
                    if length <= n:
                        sel = scored(pos, length)
                        res[str(length)] = {"kl": float(m["kl"][sel].double().mean()),
                                            "top1": float(m["agree"][sel].double().mean())}
                res["head_cpu_seconds"] = head_cpu
                write_json(path, res)
                path.with_suffix(".pt").unlink(missing_ok=True)
                found[key] = res
                passes["run"] += 1
            log(f"  LM head for {len(pending)} passes at {n} tokens: {time.time() - t0:.0f} s")
        return found

    def needle(keep: list[int], length: int) -> float:
        """Passkey accuracy at `length` for `fmt` with `keep` in the model dtype (cached; a full-attention model)."""
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

    def held(keep: list[int] | None, per_token: float) -> float:
        """KV bytes one `longest`-token sequence holds, per token: a sliding layer holds its window only (the
        planner's per-layer accounting, trtkv.recipe.attention); = the per-token formula on a full-attention model."""
        if not window:
            return per_token
        layers = [LayerAttention(AttentionKind.SLIDING, window) if k == SLIDING else LayerAttention(AttentionKind.FULL)
                  for k in kinds]
        if keep is None:  # another uniform format (probe.json): its per-token bytes spread evenly over the layers
            return sum(x.tokens_held(longest) for x in layers) * per_token / (n_layers * longest)
        return sum(x.tokens_held(longest) * kv_bytes_per_token(1, heads, dim, keep_fmt if i in keep else choice.base)
                   for i, x in enumerate(layers)) / longest

    log(f"probe --per-layer {choice.name}: {2 * n_layers + 1} passes at {sweep} tokens, then up to "
        f"{max_keep + (4 if window else 2)} at {longest}")
    sens = measure([[], *([j for j in everything if j != i] for i in everything), *([i] for i in everything)], sweep)
    uniform = sens[()]
    rows = []
    for i in everything:
        only = sens[tuple(j for j in everything if j != i)]
        but = sens[(i,)]
        rows.append({"layer": i, "kl_only": only[str(sweep)]["kl"], "top1_only": only[str(sweep)]["top1"],
                     "kl_all_but": but[str(sweep)]["kl"], "top1_all_but": but[str(sweep)]["top1"],
                     "gain": uniform[str(sweep)]["kl"] - but[str(sweep)]["kl"],
                     **({"attention": "sliding" if kinds[i] == SLIDING else "full"} if window else {})})
    for row, st, clip in zip(rows, _stats_rows(scales, n_layers), uniform.get("clip_by_layer") or [None] * n_layers,
                             strict=True):
        row.update(st, clip_rate=clip)
    order = sorted(everything, key=lambda i: rows[i]["gain"], reverse=True)
    uniform_kl = uniform[str(sweep)]["kl"]
    log(f"  sensitivity done: {passes['run']} passes run, {passes['cached']} cached, {time.time() - t_start:.0f} s")
    # verification at the longest length: uniform, all-16-bit, the greedy sets and (a windowed model) the sliding
    # layers kept (vLLM's `--kv-cache-dtype-skip-layers sliding_window`) and the full-attention layers kept
    named = {"sliding_window": sliding, "full_attention": [i for i in everything if i not in sliding]} if window else {}
    greedy = [sorted(order[:k]) for k in range(1, max_keep + 1)]
    got_long = measure([[], everything, *greedy, *named.values()], longest)

    def point(label: str, keep: list[int], fmt_name: str, skip: list[Any]) -> dict[str, Any]:
        got = got_long[tuple(keep)]
        return {"label": label, "keep": keep, "skip": skip, "format": fmt_name,
                "bytes_per_token": held(keep, got["bytes_per_token_formula"]),
                "bytes_per_token_formula": got["bytes_per_token_formula"],
                "stored_bytes_per_token": got["stored_bytes"] / longest,
                "kl_sweep": got[str(sweep)]["kl"], "top1_sweep": got[str(sweep)]["top1"],
                "kl_longest": got[str(longest)]["kl"], "top1_longest": got[str(longest)]["top1"],
                "kl_by_length": {n: got[n]["kl"] for n in map(str, sorted(settings.lengths)) if n in got},
                "top1_by_length": {n: got[n]["top1"] for n in map(str, sorted(settings.lengths)) if n in got},
                "cpu_seconds": got.get("cpu_seconds"), **({"needles": got["needles"]} if "needles" in got else {})}

    def predicted(keep: list[int]) -> float:
        return max(0.0, uniform_kl - sum(rows[i]["gain"] for i in keep))

    candidates = []
    for keep in greedy:
        c = point(f"{choice.name}+{keep_fmt.value}{keep}", keep, choice.name, keep)
        c["predicted_kl_sweep"] = predicted(keep)
        c["prediction_error"] = (c["predicted_kl_sweep"] - c["kl_sweep"]) / c["kl_sweep"] if c["kl_sweep"] else None
        candidates.append(c)
    sets = {}
    for name, keep in named.items():
        same = next((c for c in candidates if c["keep"] == keep), None)
        if same is not None:  # the greedy search found it: one point, named
            same["set"] = name
            sets[name] = same
            continue
        skip: list[Any] = ["sliding_window"] if name == "sliding_window" else keep
        sets[name] = point(f"{choice.name}+{keep_fmt.value}[{name}]", keep, choice.name, skip)
        sets[name].update(set=name, predicted_kl_sweep=predicted(keep))
    points = [point(choice.name, [], choice.name, []), point(keep_fmt.value, everything, keep_fmt.value, []),
              *candidates, *(p for p in sets.values() if p not in candidates),
              *_probe_points(out, choice.name, sweep, longest, held)]
    if settings.needle_lengths:
        log(f"  needle retrieval at {settings.needle_lengths} for {len(points)} configurations")
        probe_needles = _probe_needles(out)
        for p in points:
            if p.get("source") == "probe.json":
                p["needle"] = {str(n): probe_needles.get((p["label"], n)) for n in settings.needle_lengths}
            elif window:  # asked from the verification pass itself (trtkv.probe.needles)
                p["needle"] = {str(n): (p.get("needles") or {}).get(str(n), {}).get("accuracy")
                               for n in settings.needle_lengths}
            else:
                p["needle"] = {str(n): needle(p["keep"], n) for n in settings.needle_lengths}
    for p in points:  # which engines serve it (the recipe's own rules, per backend and GPU)
        p["serving"] = serving(recipe, p["format"], p["skip"])
    budget = max_bytes_per_token if max_bytes_per_token is not None else (
        None if max_kl is not None else DEFAULT_BYTES_HEADROOM * points[0]["bytes_per_token"])
    eligible = [p for p in points
                if (budget is None or p["bytes_per_token"] <= budget) and (max_kl is None or p["kl_longest"] <= max_kl)]
    cheapest = max_kl is not None
    usable = usable_gpus([p["serving"] for p in points])
    best = _pick([p for p in eligible if p["serving"]["engines"]], cheapest)
    best_any = _pick(eligible, cheapest)
    doc = {"recipe": recipe.name, "format": choice.name, "keep_format": keep_fmt.value, "sweep_length": sweep,
           "longest_length": longest, "lengths": settings.lengths, "layers": rows, "order_by_gain": order,
           "sensitivity_uniform": uniform[str(sweep)],
           "uniform": points[0], "all_16bit": points[1], "candidates": candidates, "sets": sets, "points": points,
           "front_sweep": pareto(points, "kl_sweep"), "front_longest": pareto(points, "kl_longest"),
           "front_longest_top1": pareto([{**p, "top1_miss": 1.0 - p["top1_longest"]} for p in points], "top1_miss"),
           "front_longest_served": pareto([p for p in points if p["serving"]["engines"]], "kl_longest"),
           "needle_lengths": settings.needle_lengths, "front_needle": _needle_front(points, settings.needle_lengths),
           "gpus_usable": usable,
           "budget": {"max_bytes_per_token": budget, "max_kl": max_kl}, "recommended": best,
           "best_not_served": best_any if best_any is not None and best_any is not best else None,
           "passes": passes, "seconds": round(time.time() - t_start, 1),
           "cpu_seconds": round(time.process_time() - c_start, 1), "method": __doc__}
    if rows_sweep is not None and rows_long is not None:
        doc["windowed"] = {"sliding_window": window, "sliding_layers": sliding, "full_layers": named["full_attention"],
                           "sensitivity_rows": int(rows_sweep.numel()), "longest_rows": int(rows_long.numel()),
                           "verification_rows": int(union.numel()) if union is not None else 0}
    if best is not None:
        doc["deploy"] = _deploy(best, usable)
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


def _deploy(point: dict[str, Any], usable: list[str]) -> dict[str, Any]:
    """The recipe settings that deploy `point`, and the engines that serve it."""
    skip = point.get("skip")
    kv = KV_CACHE_OF_FORMAT.get(point["format"])
    out: dict[str, Any] = {"served_by": served_by(point["serving"], usable), "engines": point["serving"]["engines"]}
    if skip and kv is not None and kv.value != "none":
        out.update({"quantization.kv_cache": kv.value, "quantization.kv_skip_layers": skip,
                    "vllm": f"--kv-cache-dtype-skip-layers {' '.join(map(str, skip))}"})
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


def _probe_points(out: Path, fmt: str, sweep: int, longest: int,
                  held: Callable[[list[int] | None, float], float]) -> list[dict[str, Any]]:
    """The probe's other uniform formats at the same two lengths (probe.json), for the front; `held`: the KV bytes
    per token a `longest`-token sequence holds, from the per-token formula (a windowed model's sliding layers hold
    their window only)."""
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
        formula = a["kv_bytes_per_token_formula"]
        out_points.append({"label": name, "keep": None, "skip": [], "format": name,
                           "bytes_per_token": held(None, formula), "bytes_per_token_formula": formula,
                           "kl_sweep": a["kl_mean"], "kl_longest": b["kl_mean"], "top1_sweep": a["top1_agreement"],
                           "top1_longest": b["top1_agreement"], "source": "probe.json"})
    return out_points
