"""What each engine does with a checkpoint's KV scale tensors, layer by layer: the engine's loader
rules for the architecture (trtkv.engines.kv_scale_loaders) applied to every stored name, then its
pairing table to the classes of what it loaded; and the findings that follow (a crash at load, a
name dropped, a layer at 1.0 despite stored scales, an engine that never reads them)."""

from __future__ import annotations

import math
from functools import partial

from trtkv.checkpoints.kv_scale_tensors import CheckpointScales, ScaleTensor
from trtkv.engines.kv_scale_findings import (
    FAIL,
    INFO,
    USE_WORDS,
    WARN,
    EngineLayer,
    EngineVerdict,
    Finding,
    span_layers,
)
from trtkv.engines.kv_scale_loaders import EngineScales, Loader


def value_class(values: tuple[float, ...]) -> str:
    """What the engines' `> 0.0` / `< 0.0` tests see (a per-head tensor: its worst element)."""
    if not values:
        return "absent"
    if any(math.isnan(x) for x in values):
        return "nan"
    if any(x < 0 for x in values):
        return "negative"
    if any(x == 0 for x in values):
        return "zero"
    return "positive"


def engine_verdict(engine: EngineScales, ckpt: CheckpointScales) -> EngineVerdict:
    verdict = partial(EngineVerdict, engine.engine, engine.version)
    if engine.reads != ckpt.format:
        what = {"hf": "an HF checkpoint"}.get(engine.reads, "a TensorRT-LLM checkpoint")
        return verdict(False, "", f"does not load this folder (it reads {what})")
    if ckpt.kv_algo not in engine.kv_algos:
        why = f"what it does with {ckpt.kv_algo} KV scales is not modelled here "
        return verdict(True, "", why + "(docs/kv-formats.md has the format's row)")
    loader = engine.loader_for(ckpt.architecture)
    if loader is None:
        why = f"{ckpt.architecture}'s loader is not modelled: read its load_weights"
        return verdict(True, "", why)
    by_layer: dict[int, list[ScaleTensor]] = {}
    for t in ckpt.tensors:
        by_layer.setdefault(t.layer, []).append(t)
    layers = [
        _engine_layer(engine, loader, i, by_layer.get(i, []))
        for i in sorted(set(by_layer) | set(ckpt.kv_layers))
    ]
    return verdict(True, loader.description, _summary(layers), tuple(layers))


def _engine_layer(
    engine: EngineScales, loader: Loader, layer: int, tensors: list[ScaleTensor]
) -> EngineLayer:
    loaded: dict[str, tuple[float, ...]] = {}
    dropped, crash, warning, unused, unknown = [], None, None, False, []
    for t in tensors:
        rule = loader.rule_for(t.name)
        if rule.then == "load":
            loaded.setdefault(rule.kind_for(t.name, t.kind), t.values)
        elif rule.then == "not_modelled":
            unknown.append(t.name)
        elif rule.then in ("drop_warn", "drop_silent"):
            dropped.append(t.name)
            warning = warning or rule.warning
        elif rule.then == "crash":
            dropped.append(t.name)
            crash = crash or rule.error
        else:
            unused = True
    if crash:
        return EngineLayer(layer, "crash", None, None, tuple(dropped), crash)
    if unknown:
        return EngineLayer(layer, "unknown", None, None, tuple(unknown))
    k, v, kv = (value_class(loaded.get(x, ())) for x in ("k", "v", "kv"))
    case = engine.pair(k, v, kv)
    if case.uses == "crash":
        return EngineLayer(layer, "crash", None, None, tuple(dropped), case.error)
    if case.uses == "unity":
        uses = "unused" if unused and not dropped else "unity"
        return EngineLayer(layer, uses, 1.0, 1.0, tuple(dropped), None, case.warning or warning)
    kk, vk = {"separate": ("k", "v"), "k_for_both": ("k", "k"), "shared": ("kv", "kv")}[case.uses]
    return EngineLayer(
        layer, case.uses, max(loaded[kk]), max(loaded[vk]), tuple(dropped), None, warning
    )


def _summary(layers: list[EngineLayer]) -> str:
    counts: dict[str, list[int]] = {}
    for el in layers:
        counts.setdefault(el.uses, []).append(el.layer)
    return "; ".join(f"{span_layers(ls)}: {USE_WORDS[u]}" for u, ls in counts.items())


def engine_findings(
    verdict: EngineVerdict, engine: EngineScales, ckpt: CheckpointScales
) -> list[Finding]:
    if not verdict.applies:
        return []
    name = engine.label
    if not verdict.layers:
        return [Finding("not_modelled", INFO, f"{name}: {verdict.summary}", engine=engine.engine)]
    out: list[Finding] = []

    def add(code: str, severity: str, message: str, layers: list[int]) -> None:
        out.append(Finding(code, severity, message, tuple(layers), engine.engine))

    unknown = [el for el in verdict.layers if el.uses == "unknown"]
    if unknown:
        layers = [el.layer for el in unknown]
        add(
            "not_modelled",
            INFO,
            f"{name}: how its {ckpt.architecture} loader reads {unknown[0].dropped[0]} is not "
            f"modelled ({span_layers(layers)}): read its load_weights",
            layers,
        )
    crash = [el for el in verdict.layers if el.uses == "crash"]
    if crash:
        layers = [el.layer for el in crash]
        add(
            "crash", FAIL, f"{name} stops at load: {crash[0].error} ({span_layers(layers)})", layers
        )
    dropped = [el for el in verdict.layers if el.dropped and el.uses not in ("crash", "unknown")]
    if dropped:
        first, layers = dropped[0], [el.layer for el in dropped]
        how = f"with the warning '{first.warning}'" if first.warning else "without a word"
        add(
            "dropped",
            FAIL,
            f"{name}'s {ckpt.architecture} loader drops {first.dropped[0]} ({span_layers(layers)}) "
            f"{how}; layer {first.layer} then uses {USE_WORDS[first.uses]}",
            layers,
        )
    stored = {t.layer for t in ckpt.tensors if t.kind in ("k", "v", "kv")}
    unity = [
        el.layer
        for el in verdict.layers
        if el.uses == "unity" and el.layer in stored and not el.dropped
    ]
    if unity:
        add(
            "defaults",
            FAIL,
            f"{name} runs {span_layers(unity)} at 1.0 although the checkpoint has scales there "
            "(none it accepts as valid)",
            unity,
        )
    if stored and any(el.uses == "unused" for el in verdict.layers):
        add(
            "ignored",
            WARN,
            f"{name} never reads FP8 KV scales: every layer runs 1.0 whatever the checkpoint holds "
            "(--calibrate says what that clips)",
            [],
        )
    return out
