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
"""  # noqa: E501

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trtkv.core.errors import TrtkvError
from trtkv.kvcache.formats import KVFormat
from trtkv.kvcache.names import FormatChoice, parse_format
from trtkv.probe.layer_passes import LayerPasses
from trtkv.probe.layers_report import markdown, plot, summary_line
from trtkv.probe.layers_search import add_needles, fronts, sensitivity, verified_points
from trtkv.probe.measure import probe_scales, reference_hidden
from trtkv.probe.metrics import head_positions
from trtkv.probe.serving import kv_cache_of_format, served_by, serving, usable_gpus
from trtkv.probe.setup import default_settings, load_model, write_json
from trtkv.probe.sweep import probe_output
from trtkv.probe.window import sliding_window
from trtkv.recipe import Recipe

SWEEP_LEN = 2048
# a windowed model's sensitivity passes: LM-head rows per pass (evenly spaced)
SENSITIVITY_ROWS = 512
DEFAULT_BYTES_HEADROOM = 1.15  # the budget: at most 15% more bytes than the uniform format


def _sensitivity_stride(sweep: int, long_stride: int) -> int:
    """The sensitivity rows' stride at the sweep length: at least SENSITIVITY_ROWS rows; a divisor
    of the longest pass's stride where one is near (then the verification passes, which score both
    sets, add no head rows below the sweep length)."""
    wanted = max(1, -(-(sweep - 1) // SENSITIVITY_ROWS))
    near = max(d for d in range(1, min(wanted, long_stride) + 1) if long_stride % d == 0)
    return near if 2 * near >= wanted else wanted


@dataclass(frozen=True)
class PerLayerOptions:
    """What `trtkv probe --per-layer FORMAT` takes besides the recipe (trtkv.cli.probe's flags): the
    format, the probe's lengths (default probe.lengths), the largest set of 16-bit layers tried, the
    budget (bytes per token, or the KL; default 15% more bytes than the uniform format), torch's
    threads, the needle lengths (default none) and the sensitivity passes' length (default
    SWEEP_LEN, at most the longest length)."""

    fmt: str
    lengths: list[int] | None = None
    max_keep: int = 4
    max_bytes_per_token: float | None = None
    max_kl: float | None = None
    threads: int | None = None
    needle_lengths: list[int] | None = None
    sweep_length: int | None = None


def run_per_layer(
    recipe: Recipe,
    opts: PerLayerOptions,
    output: Path | None = None,
    log: Callable[[str], None] = print,
) -> Path:
    """`trtkv probe RECIPE --per-layer FORMAT`, the method of this module's docstring step by step:
    load the model and its reference, the sensitivity passes, the verified sets and the front, the
    needles, which engines serve each point, the recommendation; writes
    per_layer_<format>.json/.md/.png under the probe's output and returns the .json."""
    choice = _per_token_format(opts)
    out = probe_output(recipe, output)
    t_start, c_start = time.time(), time.process_time()
    lp = _open(recipe, choice, opts, out, log, t_start)
    log(
        f"probe --per-layer {choice.name}: {2 * lp.n_layers + 1} passes at {lp.sweep} tokens, then "
        f"up to {opts.max_keep + (4 if lp.window else 2)} at {lp.longest}"
    )
    sens = sensitivity(lp)
    log(
        f"  sensitivity done: {lp.passes['run']} passes run, {lp.passes['cached']} cached, "
        f"{time.time() - t_start:.0f} s"
    )
    points, candidates, sets = verified_points(lp, sens, opts.max_keep, out)
    if lp.settings.needle_lengths:
        add_needles(lp, points, out)
    for p in points:  # which engines serve it (the recipe's own rules, per backend and GPU)
        p["serving"] = serving(recipe, p["format"], p["skip"])
    doc: dict[str, Any] = {
        "recipe": recipe.name,
        "format": choice.name,
        "keep_format": lp.keep_fmt.value,
        "sweep_length": lp.sweep,
        "longest_length": lp.longest,
        "lengths": lp.settings.lengths,
        "layers": sens.rows,
        "order_by_gain": sens.order,
        "sensitivity_uniform": sens.uniform[str(lp.sweep)],
        "uniform": points[0],
        "all_16bit": points[1],
        "candidates": candidates,
        "sets": sets,
        "points": points,
        **fronts(points, lp.settings.needle_lengths),
        **_recommendation(points, opts),
        "passes": lp.passes,
        "seconds": round(time.time() - t_start, 1),
        "cpu_seconds": round(time.process_time() - c_start, 1),
        "method": __doc__,
    }
    if lp.rows_sweep is not None and lp.rows_long is not None:
        doc["windowed"] = {
            "sliding_window": lp.window,
            "sliding_layers": lp.sliding,
            "full_layers": [i for i in lp.everything if i not in lp.sliding],
            "sensitivity_rows": int(lp.rows_sweep.numel()),
            "longest_rows": int(lp.rows_long.numel()),
            "verification_rows": int(lp.union.numel()) if lp.union is not None else 0,
        }
    if doc["recommended"] is not None:
        doc["deploy"] = _deploy(doc["recommended"], doc["gpus_usable"])
    return _write(doc, out, choice.name, log)


def _per_token_format(opts: PerLayerOptions) -> FormatChoice:
    """The format asked for, refused when it has nothing to keep per layer (16 bit, KIVI) or
    --max-keep < 1."""
    choice = parse_format(opts.fmt)
    if choice.base in (KVFormat.FP16, KVFormat.BF16) or choice.base.value.startswith("kivi"):
        raise TrtkvError(
            f"--per-layer {opts.fmt}: pick a quantized per-token format (fp8, int8, int4_g64, "
            "nvfp4, ...); 16-bit has nothing to keep and KIVI's window is a per-token, not "
            "per-layer, choice."
        )
    if opts.max_keep < 1:
        raise TrtkvError(f"--max-keep {opts.max_keep}: use 1 or more")
    return choice


def _open(
    recipe: Recipe,
    choice: FormatChoice,
    opts: PerLayerOptions,
    out: Path,
    log: Callable[[str], None],
    t_start: float,
) -> LayerPasses:
    """The model, its scales and the reference's hidden states, at the rows each pass scores: every
    row of a full-attention model; on a windowed model the sweep's sampled LM-head rows at the
    longest length and SENSITIVITY_ROWS evenly spaced ones at the sweep length (a 262K-wide head per
    pass would cost more than the pass)."""
    settings = default_settings(
        recipe,
        formats=[choice.name],
        lengths=opts.lengths,
        needle_lengths=opts.needle_lengths or [],
    )
    settings.threads = opts.threads
    longest = max(settings.lengths)
    sweep = min(opts.sweep_length or SWEEP_LEN, longest)
    loaded = load_model(recipe, settings)
    scales = probe_scales(recipe, loaded, settings, out)
    cache_dir = out / "cache" / "per_layer"
    rows_long = rows_sweep = union = None
    if sliding_window(loaded.model.config):
        rows_long = head_positions(loaded, longest - 1)
        rows_long = torch.arange(longest - 1) if rows_long is None else rows_long
        rows_sweep = (
            rows_long
            if sweep == longest
            else torch.arange(
                0,
                sweep - 1,
                _sensitivity_stride(
                    sweep, int(rows_long[1] - rows_long[0]) if rows_long.numel() > 1 else 1
                ),
            )
        )
        union = torch.unique(torch.cat([rows_long, rows_sweep]))  # a verification pass scores both
        # its own file: the sweep's stays valid
        ref, _ = reference_hidden(loaded, longest, cache_dir, union)
    else:
        ref, _ = reference_hidden(loaded, longest, out)
    return LayerPasses(
        loaded,
        choice,
        scales,
        recipe.kv_skip_format,
        settings,
        sweep,
        longest,
        cache_dir,
        ref,
        rows_long=rows_long,
        rows_sweep=rows_sweep,
        union=union,
        log=log,
        t_start=t_start,
    )


def _recommendation(points: list[dict[str, Any]], opts: PerLayerOptions) -> dict[str, Any]:
    """The GPUs some engine serves a point on, the budget, the best served point within it and the
    best point no engine serves (when it is another)."""
    max_kl = opts.max_kl
    budget = (
        opts.max_bytes_per_token
        if opts.max_bytes_per_token is not None
        else (None if max_kl is not None else DEFAULT_BYTES_HEADROOM * points[0]["bytes_per_token"])
    )
    eligible = [
        p
        for p in points
        if (budget is None or p["bytes_per_token"] <= budget)
        and (max_kl is None or p["kl_longest"] <= max_kl)
    ]
    cheapest = max_kl is not None
    best = _pick([p for p in eligible if p["serving"]["engines"]], cheapest)
    best_any = _pick(eligible, cheapest)
    return {
        "gpus_usable": usable_gpus([p["serving"] for p in points]),
        "budget": {"max_bytes_per_token": budget, "max_kl": max_kl},
        "recommended": best,
        "best_not_served": best_any if best_any is not None and best_any is not best else None,
    }


def _write(doc: dict[str, Any], out: Path, name: str, log: Callable[[str], None]) -> Path:
    """per_layer_<format>.json, .md and .png under `out`; the .json's path."""
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"per_layer_{name}"
    write_json(stem.with_suffix(".json"), doc)
    stem.with_suffix(".md").write_text(markdown(doc))
    plot(doc, stem.with_suffix(".png"))
    log(
        f"probe --per-layer {name}: wrote {stem}.json/.md/.png in {doc['seconds']:.0f} s "
        f"({doc['passes']['run']} passes, {doc['passes']['cached']} cached)"
    )
    log(summary_line(doc))
    return stem.with_suffix(".json")


def _pick(points: list[dict[str, Any]], cheapest: bool = False) -> dict[str, Any] | None:
    """The lowest KL at the longest length (ties: fewer bytes); with cheapest, the fewest bytes
    (ties: lower KL)."""
    key = (
        (lambda p: (p["bytes_per_token"], p["kl_longest"]))
        if cheapest
        else (lambda p: (p["kl_longest"], p["bytes_per_token"]))
    )
    return min(points, key=key, default=None)


def _deploy(point: dict[str, Any], usable: list[str]) -> dict[str, Any]:
    """The recipe settings that deploy `point`, and the engines that serve it."""
    skip = point.get("skip")
    kv = kv_cache_of_format(point["format"])
    out: dict[str, Any] = {
        "served_by": served_by(point["serving"], usable),
        "engines": point["serving"]["engines"],
    }
    if skip and kv is not None and kv.value != "none":
        out.update(
            {
                "quantization.kv_cache": kv.value,
                "quantization.kv_skip_layers": skip,
                "vllm": f"--kv-cache-dtype-skip-layers {' '.join(map(str, skip))}",
            }
        )
    elif kv is not None:
        out["quantization.kv_cache"] = kv.value
    return out
