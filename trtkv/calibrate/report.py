"""kv_scales.json and calibration_report.md: the scales written, the warnings worth acting on, the
per-layer table."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtkv.calibrate.common import DWARF_RATIO, LayerScales
from trtkv.kvcache.formats import FP8_MAX
from trtkv.kvcache.scales import CONVENTION
from trtkv.recipe import KVCacheQuant, Recipe
from trtkv.recipe.enums import kv_algo

if TYPE_CHECKING:
    pass


# ---------------------------------------------------------------------------------------------
# the report


def find_warnings(layers: list[LayerScales], kv: KVCacheQuant) -> list[str]:
    """Warnings worth acting on: clamped FP8 factors, layers whose amax dwarfs the rest, outlier
    channels."""
    out: list[str] = []
    if not layers:  # kv_cache none: no scales to warn about
        return out
    if kv is KVCacheQuant.FP8:
        clamped = [ls.layer for ls in layers if max(ls.k_amax, ls.v_amax) / FP8_MAX < 1.0]
        if clamped:
            out.append(
                f"FP8: {len(clamped)}/{len(layers)} layers' kv_cache_scaling_factor clamped to 1.0 "
                "by ModelOpt's exporter (amax < 448): TensorRT-LLM's FP8 KV cache runs those "
                "layers with scale 1.0, while hf/ (vLLM) keeps k_scale/v_scale = amax/448. Layers: "
                f"{_ranges(clamped)}."
            )
    for kind in ("k", "v"):
        amaxes = [getattr(ls, f"{kind}_amax") for ls in layers]
        median = statistics.median(amaxes)
        big = [
            (ls.layer, a)
            for ls, a in zip(layers, amaxes, strict=True)
            if median > 0 and a > DWARF_RATIO * median
        ]
        if big:
            listed = ", ".join(f"{i} ({a:.3g})" for i, a in big)
            out.append(
                f"{kind.upper()} amax of layer(s) {listed} exceeds {DWARF_RATIO:g}x the median "
                f"layer amax ({median:.3g}): one per-tensor scale spends its range on these "
                "layers' outliers."
            )
    if kv is KVCacheQuant.INT8:
        lopsided = [
            ls
            for ls in layers
            if min(ls.k_amax, ls.v_amax) * DWARF_RATIO < max(ls.k_amax, ls.v_amax)
        ]
        if lopsided:
            worst = max(
                lopsided, key=lambda ls: max(ls.k_amax, ls.v_amax) / min(ls.k_amax, ls.v_amax)
            )
            ratio = max(worst.k_amax, worst.v_amax) / min(worst.k_amax, worst.v_amax)
            levels = int(min(worst.k_amax, worst.v_amax) / worst.kv_cache_scaling_factor)
            out.append(
                f"INT8: in {len(lopsided)}/{len(layers)} layers K and V ranges differ by more than "
                f"{DWARF_RATIO:g}x, but TensorRT-LLM shares one kv_cache_scaling_factor: worst is "
                f"layer {worst.layer} ({ratio:.1f}x), whose smaller tensor uses only ~{levels} of "
                "127 levels."
            )
    out += _outlier_warnings(layers)
    return out


def _outlier_channels(values: list[float]) -> list[tuple[int, float]]:
    # the one outlier rule (K/V statistics use it too)
    from trtkv.kvcache.stats import outlier_channels

    return [(i, values[i]) for i in outlier_channels(values)]


def _outlier_warnings(layers: list[LayerScales]) -> list[str]:
    from trtkv.kvcache.stats import OUTLIER_FACTOR

    out = []
    for kind in ("k", "v"):
        hits = [(ls, _outlier_channels(getattr(ls, f"{kind}_channel_amax"))) for ls in layers]
        hits = [(ls, chans) for ls, chans in hits if chans]
        if hits:
            total = sum(len(c) for _, c in hits)
            worst, chans = max(hits, key=lambda h: max(v for _, v in h[1]))
            ch, val = max(chans, key=lambda c: c[1])
            out.append(
                f"{kind.upper()} outlier channels (amax > {OUTLIER_FACTOR:g}x the layer's median "
                f"channel amax): {total} in {len(hits)} layers; largest: layer {worst.layer} head "
                f"{ch // worst.head_dim} channel {ch % worst.head_dim}, amax {val:.3g}. A "
                f"per-tensor {kind.upper()} scale spends its range on these channels and leaves "
                "fewer levels for the others."
            )
    return out


def _ranges(items: list[int]) -> str:
    """[0,1,2,5] -> '0-2, 5'."""
    out, start = [], None
    for i, value in enumerate(items):
        if start is None:
            start = value
        if i + 1 == len(items) or items[i + 1] != value + 1:
            out.append(f"{start}" if start == value else f"{start}-{value}")
            start = None
    return ", ".join(out)


def render_report(
    recipe: Recipe,
    layers: list[LayerScales],
    timing: dict[str, Any],
    notes: list[str],
    stats_md: str | None,
    stats_note: str,
    model_dir: Path | None,
    layer_kinds: list[str] | None = None,
) -> str:
    """calibration_report.md: summary, warnings, notes, the per-layer table (with each layer's
    attention type and the amax per type when the model mixes them, e.g. Gemma 3's sliding and full
    layers), K/V statistics."""
    c, q = recipe.calibration, recipe.quantization
    kv = kv_algo(q.kv_cache)
    kv_text = (
        f"{kv} (`quantization.kv_cache_quant_algo = {kv}`)"
        if kv
        else "unquantized (`quantization.kv_cache: none` -> `quantization.kv_cache_quant_algo = "
        "null`, no kv_cache_scaling_factor tensors)"
    )
    lines = [
        f"# Calibration report: {recipe.name}",
        "",
        f"- model: `{recipe.model.source}`" + (f" (`{model_dir}`)" if model_dir else ""),
        f"- weights: {q.weights.value}; KV cache: {kv_text}",
        f"- data: `{c.dataset}`, {c.num_samples} x {c.seq_len} tokens, batch {c.batch_size}, seed "
        f"{c.seed}",
        f"- time: load {timing['load_s']} s, calibration {timing['calibration_s']} s "
        f"({timing['calibration_cpu_s']} s CPU), export "
        f"{timing['export_s']} s; peak RSS {timing['peak_rss_mib']:.0f} MiB"
        + (
            f"; calibration ran in {timing['calibration_dtype']}"
            if timing.get("calibration_dtype")
            else ""
        ),
        f"- TensorRT-LLM mapping: tp {recipe.build.tp_size} x pp {recipe.build.pp_size}",
        "",
        "## Warnings",
        "",
    ]
    found = find_warnings(layers, q.kv_cache)
    lines += [f"- {w}" for w in found] or ["- none"]
    lines += ["", "## Export notes", ""] + ([f"- {n}" for n in notes] or ["- none"])
    lines += ["", "## Per-layer scales", ""]
    if not layers:
        lines += [
            "None: the KV cache is unquantized (`quantization.kv_cache: none`), so no K/V scales "
            "were calibrated or exported. The K/V statistics below show the ranges an FP8 or INT8 "
            "KV cache would have to cover."
        ]
    else:
        kinds = layer_kinds if layer_kinds and len(layer_kinds) == len(layers) else None
        lines += _by_kind(layers, kinds) + _scale_table(layers, kinds)
    lines += ["", "## K/V statistics", "", stats_note, ""]
    if stats_md:
        lines.append(stats_md)
    return "\n".join(lines).rstrip() + "\n"


def _by_kind(layers: list[LayerScales], kinds: list[str] | None) -> list[str]:
    """K/V amax per attention type (median and range), when the model has more than one type."""
    if kinds is None or len(set(kinds)) < 2:
        return []
    lines = [
        "| attention | layers | K amax median (min-max) | V amax median (min-max) |",
        "|---|---|---:|---:|",
    ]
    for kind in sorted(set(kinds)):
        group = [ls for ls, k in zip(layers, kinds, strict=True) if k == kind]
        cells = []
        for attr in ("k_amax", "v_amax"):
            values = [getattr(ls, attr) for ls in group]
            cells.append(f"{statistics.median(values):.4g} ({min(values):.4g}-{max(values):.4g})")
        lines.append(
            f"| {kind} | {_ranges([ls.layer for ls in group])} | {cells[0]} | {cells[1]} |"
        )
    return [*lines, ""]


def _scale_table(layers: list[LayerScales], kinds: list[str] | None = None) -> list[str]:
    """The per-layer scales as a markdown table, after the convention."""
    head = "| layer | attention " if kinds else "| layer "
    lines = [
        CONVENTION,
        "",
        f"{head}| K amax | V amax | TRT-LLM kv_cache_scaling_factor | vLLM k_scale | vLLM v_scale "
        "| K max/median channel | V max/median channel |",
        "|---:" + ("|---" if kinds else "") + "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for i, ls in enumerate(layers):
        kind = f" {kinds[i]} |" if kinds else ""
        lines.append(
            f"| {ls.layer} |{kind} {ls.k_amax:.4g} | {ls.v_amax:.4g} | "
            f"{ls.kv_cache_scaling_factor:.6g} | {ls.k_scale:.6g} | {ls.v_scale:.6g} | "
            f"{_spread(ls.k_channel_amax)} | {_spread(ls.v_channel_amax)} |"
        )
    return lines


def _spread(values: list[float]) -> str:
    if not values:
        return "—"
    median = statistics.median(values)
    return f"{max(values) / median:.1f}x" if median > 0 else "—"
