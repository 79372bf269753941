"""The KV scale audit (`trtkv scales`): what a checkpoint's KV scale tensors are, per layer, and
what each engine trtkv serves will do with exactly those tensors for this architecture.

Findings and their severity (docs/kv-scales.md explains each and what to do):
- fail: `bad_value` (0, negative, NaN, inf, subnormal), `partial` (a layer with K but not V or V but
  not K), `missing_layers` (layers without scales beside layers with them), `no_scales` (the config
  declares a quantized KV cache, the checkpoint stores no scale), `dropped` (an engine's loader
  drops or refuses a scale name for this architecture), `crash` (an engine stops at load),
  `defaults` (an engine runs a layer at 1.0 although the checkpoint has scales for it), and with
  --calibrate `clips` (a layer clips more than the threshold);
- warn: `outlier` and `kv_ratio` (a layer's scale or K/V ratio far from the other layers'),
  `ignored` (an engine never reads FP8 KV scales: TensorRT-LLM's PyTorch backend), `unreadable`;
- info: `unity` (scales of exactly 1.0: ModelOpt's fp8_cast default; reported, never failed),
  `not_modelled` (an architecture whose loader trtkv has not read).
The exit code is 1 when any finding fails, else 0.
"""

from __future__ import annotations

import math
from pathlib import Path
from statistics import median

from trtkv.checkpoints.kv_scale_tensors import CheckpointScales, ScaleTensor
from trtkv.engines.kv_scale_engines import engine_findings, engine_verdict
from trtkv.engines.kv_scale_findings import (
    FAIL,
    INFO,
    USE_WORDS,
    WARN,
    Audit,
    EngineVerdict,
    Finding,
    LayerRow,
    span_layers,
)
from trtkv.engines.kv_scale_loaders import engine_scales

# smallest normal value per stored dtype: a scale below it is subnormal
MIN_NORMAL = {
    "F16": 6.103515625e-05,
    "BF16": 1.1754943508222875e-38,
    "F32": 1.1754943508222875e-38,
    "F64": 2.2250738585072014e-308,
}
# a layer's scale (or K/V ratio) is an outlier when its log is further than this from the other
# layers' median log: a factor of 8, or 4 robust deviations (1.4826 x MAD) when layers vary more
OUTLIER_FACTOR = 8.0
OUTLIER_MADS = 4.0
MIN_LAYERS_FOR_OUTLIERS = 4


def bad_value(t: ScaleTensor) -> str | None:
    """Why a stored scale is out of range (None: it is a finite normal positive number)."""
    for x in t.values:
        if math.isnan(x):
            return "NaN"
        if math.isinf(x):
            return f"{x}"
        if x == 0:
            return "zero"
        if x < 0:
            return f"negative ({x:g})"
        if x < MIN_NORMAL.get(t.dtype, 0.0):
            return f"subnormal in {t.dtype} ({x:g})"
    return None


def audit_scales(ckpt: CheckpointScales, engines: list[str] | None = None) -> Audit:
    """The audit of one checkpoint folder against `engines` (default: every engine in the table)."""
    rows = _rows(ckpt)
    rows_by = {r.layer: r for r in rows}
    chosen = [e for e in engine_scales() if engines is None or e.engine in engines]
    audit = Audit(
        folder=str(ckpt.folder),
        format=ckpt.format,
        architecture=ckpt.architecture,
        kv_algo=ckpt.kv_algo,
        conventions=sorted({t.convention for t in ckpt.tensors}),
        rows=rows,
        engines=[engine_verdict(e, ckpt) for e in chosen],
    )
    audit.findings = [
        _with_engines(f, audit.engines)
        for f in _value_findings(ckpt) + _layer_findings(ckpt, rows_by)
    ]
    audit.findings += _spread_findings(rows)
    for verdict, engine in zip(audit.engines, chosen, strict=True):
        audit.findings += engine_findings(verdict, engine, ckpt)
    return audit


def _with_engines(f: Finding, verdicts: list[EngineVerdict]) -> Finding:
    """A one-layer fault with what each engine that loads the folder does on that layer."""
    if f.severity != FAIL or len(f.layers) != 1:
        return f
    said = []
    for v in verdicts:
        el = next((x for x in v.layers if x.layer == f.layers[0]), None)
        if el is not None:
            said.append(
                f"{v.engine} {v.version} uses {USE_WORDS[el.uses]}"
                + (f" ({el.error})" if el.error else "")
            )
    return Finding(f.code, f.severity, f"{f.message}: " + "; ".join(said), f.layers) if said else f


def _rows(ckpt: CheckpointScales) -> list[LayerRow]:
    by_layer: dict[int, list[ScaleTensor]] = {}
    for t in ckpt.tensors:
        by_layer.setdefault(t.layer, []).append(t)
    rows = []
    for layer in sorted(by_layer):
        scales: dict[str, float | None] = {}
        for t in by_layer[layer]:
            scales.setdefault(t.kind, max(t.values) if t.values else None)
        k, v = scales.get("k"), scales.get("v")
        ratio = k / v if k and v and _finite(k) and _finite(v) and v > 0 and k > 0 else None
        rows.append(LayerRow(layer, scales, tuple(t.name for t in by_layer[layer]), ratio))
    return rows


def _finite(x: float) -> bool:
    return not (math.isnan(x) or math.isinf(x))


def _value_findings(ckpt: CheckpointScales) -> list[Finding]:
    out = []
    for t in ckpt.tensors:
        if not t.values:
            out.append(
                Finding(
                    "unreadable",
                    WARN,
                    f"{t.name}: dtype {t.dtype} is not a float "
                    "trtkv decodes (F32, BF16, F16, F64); not audited",
                    (t.layer,),
                )
            )
        elif (why := bad_value(t)) is not None:
            out.append(
                Finding("bad_value", FAIL, f"layer {t.layer}: {t.name} is {why}", (t.layer,))
            )
    stored = [x for t in ckpt.tensors if t.kind in ("k", "v", "kv") for x in t.values]
    unity = sorted(
        {
            t.layer
            for t in ckpt.tensors
            if t.values and all(x == 1.0 for x in t.values) and t.kind in ("k", "v", "kv")
        }
    )
    if stored and all(x == 1.0 for x in stored):
        out.append(
            Finding(
                "unity",
                INFO,
                "every K/V scale is exactly 1.0: "
                + (
                    "ModelOpt clamps this checkpoint's FP8 kv_cache_scaling_factor to >= 1.0 "
                    "(amax under 448 gives 1.0)"
                    if ckpt.format == "tensorrt_llm_checkpoint"
                    else "uncalibrated (ModelOpt's fp8_cast default)"
                )
                + ". Reported, not failed; `trtkv scales --calibrate` says what 1.0 clips",
                tuple(unity),
            )
        )
    elif unity:
        out.append(
            Finding(
                "unity",
                INFO,
                f"{span_layers(unity)} carry a scale of exactly 1.0 (uncalibrated there?)",
                tuple(unity),
            )
        )
    return out


def _layer_findings(ckpt: CheckpointScales, rows_by: dict[int, LayerRow]) -> list[Finding]:
    out = []
    kv_rows = {i: r for i, r in rows_by.items() if {"k", "v", "kv"} & set(r.scales)}
    if not kv_rows:
        if ckpt.kv_algo:
            out.append(
                Finding(
                    "no_scales",
                    FAIL,
                    f"the config declares a {ckpt.kv_algo} KV cache but "
                    "the checkpoint stores no K/V scale: every engine runs 1.0",
                )
            )
        return out
    for i, r in sorted(kv_rows.items()):
        kinds = set(r.scales)
        if "kv" not in kinds and ("k" in kinds) != ("v" in kinds):
            has, lacks = ("k", "v") if "k" in kinds else ("v", "k")
            out.append(
                Finding("partial", FAIL, f"layer {i}: {has}_scale without {lacks}_scale", (i,))
            )
    expected = set(ckpt.kv_layers) or set(kv_rows)
    missing = sorted(expected - set(kv_rows))
    if missing:
        out.append(
            Finding(
                "missing_layers",
                FAIL,
                f"{span_layers(missing)} have no K/V scale while "
                f"{len(kv_rows)} other layer(s) do: engines run them at 1.0",
                tuple(missing),
            )
        )
    return out


def _spread_findings(rows: list[LayerRow]) -> list[Finding]:
    out = []
    series = {"k": "K scale", "v": "V scale", "kv": "shared KV scale"}
    for kind, label in series.items():
        vals = {r.layer: r.scales[kind] for r in rows if _usable(r.scales.get(kind))}
        out += [
            Finding(
                "outlier",
                WARN,
                f"layer {i}: {label} {vals[i]:.4g} is {how} the other layers' (median {med:.4g})",
                (i,),
            )
            for i, how, med in _outliers(vals)
        ]
    ratios: dict[int, float | None] = {r.layer: r.kv_ratio for r in rows if r.kv_ratio}
    out += [
        Finding(
            "kv_ratio",
            WARN,
            f"layer {i}: K/V scale ratio {ratios[i] or 0:.3g} is {how} the "
            f"other layers' (median {med:.3g})",
            (i,),
        )
        for i, how, med in _outliers(ratios)
    ]
    return out


def _usable(x: float | None) -> bool:
    return x is not None and _finite(x) and x > 0


def _outliers(vals: dict[int, float | None]) -> list[tuple[int, str, float]]:
    """(layer, "Nx above"/"Nx below", median of the others) for each layer far from the others."""
    if len(vals) < MIN_LAYERS_FOR_OUTLIERS:
        return []
    logs = {i: math.log(v) for i, v in vals.items() if v}
    out = []
    for i, x in logs.items():
        others = [y for j, y in logs.items() if j != i]
        mid = median(others)
        mad = 1.4826 * median(abs(y - mid) for y in others)
        limit = max(math.log(OUTLIER_FACTOR), OUTLIER_MADS * mad)
        if abs(x - mid) > limit:
            factor = math.exp(abs(x - mid))
            out.append((i, f"{factor:.3g}x {'above' if x > mid else 'below'}", math.exp(mid)))
    return out


def audit_folder(path: Path, engines: list[str] | None = None) -> list[Audit]:
    """The audit of every checkpoint folder at `path` (itself, and trtkv's hf/ export beside a
    TensorRT-LLM checkpoint)."""
    from trtkv.checkpoints.kv_scale_tensors import checkpoint_folders, read_checkpoint_scales

    return [audit_scales(read_checkpoint_scales(f), engines) for f in checkpoint_folders(path)]
