"""`trtkv scales` end to end: a target (checkpoint folder or recipe) audited, and with --calibrate
the clip cost of each engine's scales measured on the model itself.

The clip cost: the unquantized model runs over the shipped calibration text (the batches `trtkv
calibrate` and the probe build: trtkv.kvcache.scales.calibration_batches, 16 x 256 tokens, seed
1234), K taken after RoPE as the cache stores it; per layer and engine, the share of K and V values
whose magnitude exceeds what the scale the engine will use can represent (FP8 E4M3: 448 x scale,
INT8: 127 x scale), beside the fresh amax (a calibrated scale is amax / 448). A layer whose share
exceeds the threshold (default 0.1%) fails. NVFP4's two-level scales are not modelled here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from trtkv.core.errors import StageError
from trtkv.engines.kv_scale_audit import audit_folder
from trtkv.engines.kv_scale_findings import FAIL, Audit, Finding
from trtkv.kvcache import FP8_MAX, scales

# the |value| a static scale of each checkpoint KV algorithm maps to (none declared: FP8's)
QMAX: dict[str | None, float] = {"FP8": FP8_MAX, "INT8": scales.ALGO_QMAX["INT8"], None: FP8_MAX}
CALIB_SAMPLES, CALIB_SEQ_LEN, CALIB_BATCH, CALIB_SEED = 16, 256, 4, 1234
FIT_MARGIN = 1.5  # the model's stored bytes x this must fit in the memory free now


def audit_target(
    target: str,
    overrides: list[str],
    engines: list[str] | None,
    calibrate: bool = False,
    model: str | None = None,
    threshold: float = 1e-3,
) -> list[Audit]:
    """Audit a checkpoint folder, or a recipe's engines/<recipe>/checkpoint/ (and its hf/)."""
    recipe = None
    folder = Path(target).expanduser()
    if not folder.is_dir():
        from trtkv.recipe import load_recipe
        from trtkv.recipe.layout import checkpoint_dir

        recipe = load_recipe(target, overrides)
        folder = checkpoint_dir(recipe)
        if not folder.is_dir():
            raise StageError(
                f"{folder}: recipe {recipe.name} has no checkpoint yet. Next: `trtkv "
                f"calibrate {recipe.name}`, or pass a checkpoint folder."
            )
    audits = audit_folder(folder, engines)
    if calibrate:
        model_dir = Path(model).expanduser() if model else None
        if model_dir is None and recipe is not None:
            from trtkv.checkpoints.models import resolve_model_dir

            model_dir = resolve_model_dir(recipe)
        add_clip_cost(audits, model_dir, threshold)
    return audits


def add_clip_cost(audits: list[Audit], model_dir: Path | None, threshold: float) -> None:
    """Measure each engine's per-layer clip share on the model (one pass for every folder) and add
    `clips` findings."""
    plans: dict[str, dict[int, tuple[float, float]]] = {}
    measured = []
    for audit in audits:
        why = _unknown(audit, model_dir)
        if why or model_dir is None:
            audit.clip = {"unknown": why}
            continue
        measured.append(audit)
        for e in audit.engines:
            if e.applies and e.layers:
                plans[_plan_key(audit, e.engine, e.version)] = {
                    el.layer: (el.k, el.v)
                    for el in e.layers
                    if el.k is not None and el.v is not None
                }
    if not measured or model_dir is None:
        return
    limits = {
        key: {i: (k * QMAX[a.kv_algo], v * QMAX[a.kv_algo]) for i, (k, v) in plans[key].items()}
        for a in measured
        for key in plans
        if key.startswith(a.folder + "|")
    }
    stats = measure_clipping(model_dir, limits)
    for audit in measured:
        _clip_findings(audit, plans, stats, threshold)


def _plan_key(audit: Audit, engine: str, version: str) -> str:
    return f"{audit.folder}|{engine} {version}"


def _clip_findings(audit: Audit, plans: dict, stats: dict, threshold: float) -> None:
    qmax = QMAX[audit.kv_algo]
    audit.clip = {"source": stats["source"], "threshold": threshold, "qmax": qmax, "engines": {}}
    for key, layers in plans.items():
        folder, name = key.split("|", 1)
        if folder != audit.folder:
            continue
        rows = []
        for i, (k, v) in sorted(layers.items()):
            if i not in stats["amax"]:
                continue
            k_clip, v_clip = stats["clipped"][key][i]
            total = stats["values"][i]
            rows.append(
                {
                    "layer": i,
                    "k_scale": k,
                    "v_scale": v,
                    "k_clip": k_clip / total,
                    "v_clip": v_clip / total,
                    "k_amax": stats["amax"][i][0],
                    "v_amax": stats["amax"][i][1],
                }
            )
        audit.clip["engines"][name] = rows
        over = [r["layer"] for r in rows if max(r["k_clip"], r["v_clip"]) > threshold]
        if over:
            worst = max(rows, key=lambda r: max(r["k_clip"], r["v_clip"]))
            audit.findings.append(
                Finding(
                    "clips",
                    FAIL,
                    f"{name}: {len(over)} layer(s) clip more than {threshold:.3%} of their "
                    f"K or V values on the calibration text (worst: layer {worst['layer']}, K "
                    f"{worst['k_clip']:.2%}, V {worst['v_clip']:.2%}; scales k "
                    f"{worst['k_scale']:.4g}, v {worst['v_scale']:.4g} vs fresh amax/{qmax:g} k "
                    f"{worst['k_amax'] / qmax:.4g}, "
                    f"v {worst['v_amax'] / qmax:.4g})",
                    tuple(over),
                    name.split()[0],
                )
            )


def _unknown(audit: Audit, model_dir: Path | None) -> str | None:
    """Why the clip cost cannot be measured here (None: it can)."""
    if audit.kv_algo not in QMAX:
        return f"{audit.kv_algo} KV's two-level scales are not modelled by --calibrate"
    if model_dir is None:
        return "no unquantized model to run: pass --model DIR, or a recipe instead of a folder"
    if not (model_dir / "config.json").is_file():
        return f"{model_dir} has no config.json: pass the unquantized HF model folder with --model"
    stored = sum(p.stat().st_size for p in model_dir.glob("*.safetensors"))
    free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if stored * FIT_MARGIN > free:
        return (
            f"the model ({stored / 2**30:.1f} GiB stored) does not fit in the "
            f"{free / 2**30:.1f} GiB free here: run it where it fits"
        )
    return None


def measure_clipping(model_dir: Path, limits: dict[str, dict[int, tuple[float, float]]]) -> dict:
    """Run the model on the shipped calibration text; per layer the K/V amax, the value count, and
    per plan (name -> layer -> (K limit, V limit)) how many K and V values exceed the limits."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

    from trtkv.core.texts import CALIB_DEFAULT, load_texts

    tok = AutoTokenizer.from_pretrained(model_dir)
    # a GPU runs the model dtype; a CPU float32 (bf16 matmuls are slow without AVX-512 BF16)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = "auto" if device == "cuda" else torch.float32
    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    model = model.to(device).eval()
    batches = scales.calibration_batches(
        tok,
        load_texts(CALIB_DEFAULT),
        CALIB_SAMPLES,
        CALIB_SEQ_LEN,
        CALIB_BATCH,
        CALIB_SEED,
        where=str(CALIB_DEFAULT),
    )
    amax: dict[int, tuple[float, float]] = {}
    values: dict[int, int] = {}
    clipped: dict[str, dict[int, list[int]]] = {n: {} for n in limits}
    with torch.inference_mode():
        for ids in batches:
            cache = DynamicCache(config=model.config)
            model(input_ids=ids.to(device), past_key_values=cache, use_cache=True, logits_to_keep=1)
            for i, layer in enumerate(cache.layers):
                keys, vals = getattr(layer, "keys", None), getattr(layer, "values", None)
                if keys is None or vals is None:
                    continue
                ka, va = keys.float().abs(), vals.float().abs()
                old = amax.get(i, (0.0, 0.0))
                amax[i] = (max(old[0], float(ka.max())), max(old[1], float(va.max())))
                values[i] = values.get(i, 0) + ka.numel()
                _count(clipped, limits, i, ka, va)
    return {
        "amax": amax,
        "values": values,
        "clipped": clipped,
        "source": f"{model_dir}, {CALIB_SAMPLES} x {CALIB_SEQ_LEN} tokens of "
        f"{CALIB_DEFAULT}, seed {CALIB_SEED}",
    }


def _count(clipped: dict, limits: dict, layer: int, ka: Any, va: Any) -> None:
    for name, plan in limits.items():
        if layer in plan:
            k_lim, v_lim = plan[layer]
            row = clipped[name].setdefault(layer, [0, 0])
            row[0] += int((ka > k_lim).sum())
            row[1] += int((va > v_lim).sum())
