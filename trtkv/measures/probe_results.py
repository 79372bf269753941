"""Probe results on disk, read back: probe.json for the planner's advice (and
per_layer_<format>.json), the printed table and the verdict of a record; `trtkv probe` writes them
(trtkv.probe.outputs).

No torch here: `trtkv plan` must start fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from trtkv.core import paths
from trtkv.kvcache.engines import load_table
from trtkv.recipe.layout import probe_dir as probe_dir_of

if TYPE_CHECKING:
    from trtkv.contracts.probe_doc import ProbeDoc, ProbeRecord
    from trtkv.recipe import Recipe

# Verdict thresholds at the longest probed length (top-1 agreement with the reference, relative ppl
# change).
SAFE_TOP1, SAFE_PPL = 0.97, 0.01
CAUTION_TOP1, CAUTION_PPL = 0.90, 0.05
# needle accuracy may trail the reference by this much before it counts against a format
NEEDLE_SLACK = 0.2


def _read(path: Path) -> ProbeDoc | None:
    """A probe.json through its typed model (None when absent, unreadable or without records)."""
    from trtkv.contracts.probe_doc import ProbeDoc
    from trtkv.core.errors import StageError

    try:
        doc = ProbeDoc.load(path.parent)
    except StageError:
        return None
    return doc if doc is not None and doc.records else None


def find_probe(recipe: Recipe, probe_dir: Path | None = None) -> tuple[Path, ProbeDoc] | None:
    """The probe results for this recipe's model: probe_dir, else engines/<recipe>/probe, else the
    newest probe of another recipe with the same model source and architecture."""
    if probe_dir is not None:
        doc = _read(Path(probe_dir) / "probe.json")
        return (Path(probe_dir), doc) if doc else None
    own = probe_dir_of(recipe)
    doc = _read(own / "probe.json")
    if doc:
        return own, doc
    root = paths.engines_dir()
    found = []
    for path in root.glob("*/probe/probe.json") if root.is_dir() else []:
        other = _read(path)
        mine = (recipe.model.source, recipe.model.num_layers)
        if other and (other.model.source, other.model.num_layers) == mine:
            found.append((path.stat().st_mtime, path.parent, other))
    if not found:
        return None
    _, folder, doc = max(found, key=lambda x: x[0])
    return folder, doc


def load_probe(recipe: Recipe, probe_dir: Path | None = None) -> ProbeDoc | None:
    hit = find_probe(recipe, probe_dir)
    return hit[1] if hit else None


def summary_lines(records: list[ProbeRecord]) -> list[str]:
    """`trtkv probe`'s printed table, one line per record; the format column as wide as the longest
    name."""
    width = max([11, *(len(r.format) for r in records)])
    return [
        f"  {r.format:>{width}} @ {r.context_len:>5}: KL {r.kl_mean:.5f}  top-1 "
        f"{r.top1_agreement:.1%}  ppl {r.ppl:.3f} ({r.ppl_delta:+.3f})  bytes/token "
        f"{r.kv_bytes_per_token:.0f}"
        + (f"  needle {r.needle_accuracy:.0%}" if r.needle_accuracy is not None else "")
        for r in records
    ]


def classify(rec: ProbeRecord, ref_needle: float | None = None) -> str:
    """'safe', 'caution' or 'risky' for one record (top-1 agreement, relative ppl change,
    needle)."""
    rel = abs(rec.ppl_delta) / max(rec.ppl_ref or rec.ppl or 1.0, 1e-9)
    needle = rec.needle_accuracy
    needle_ok = needle is None or ref_needle is None or needle >= ref_needle - NEEDLE_SLACK
    if rec.top1_agreement >= SAFE_TOP1 and rel <= SAFE_PPL and needle_ok:
        return "safe"
    if rec.top1_agreement >= CAUTION_TOP1 and rel <= CAUTION_PPL:
        return "caution"
    return "risky"


def needle_by_format(doc: ProbeDoc) -> dict[str, float]:
    """Mean needle accuracy per format over the probed needle lengths."""
    acc: dict[str, list[float]] = {}
    for row in doc.needles:
        acc.setdefault(row.format, []).append(row.accuracy)
    return {f: sum(v) / len(v) for f, v in acc.items()}


def probe_advice(recipe: Recipe, probe_dir: Path | None = None) -> tuple[list[str], str] | None:
    """Advice built from measured probe records, or None when there are none for this model."""
    hit = find_probe(recipe, probe_dir)
    if hit is None:
        return None
    folder, data = hit
    records = data.records
    longest = max(r.context_len for r in records)
    needles = needle_by_format(data)
    ref_needle = needles.get(data.reference)
    rows = sorted(
        (r for r in records if r.context_len == longest), key=lambda r: r.kv_bytes_per_token
    )
    out = []
    safe = []
    for r in rows:
        needle = needles.get(r.format)
        verdict = classify(r.model_copy(update={"needle_accuracy": needle}), ref_needle)
        needle_txt = f", needle {needle:.0%}" if needle is not None else ""
        out.append(
            f"{r.format} at {longest} tokens: KL {r.kl_mean:.4f}, top-1 agreement "
            f"{r.top1_agreement:.1%}, ppl delta {r.ppl_delta:+.3f}{needle_txt} -> {verdict}"
        )
        if verdict == "safe" and r.format not in ("fp16", "bf16"):
            safe.append(r)
    if safe:
        best = min(safe, key=lambda r: r.kv_bytes_per_token)
        out.append(
            f"Smallest KV format measured safe on this model up to {longest} tokens: "
            f"{best.format} ({best.kv_bytes_per_token:.0f} B/token)."
        )
    else:
        out.append(
            f"No quantized KV format measured safe up to {longest} tokens on this model: keep "
            "16-bit KV."
        )
    out += engine_format_notes(records)
    from trtkv.measures.probe_attention import advice_lines

    out += advice_lines(data)
    mine = recipe_probe_format(recipe)
    if mine and not any(_same_format(r.format, mine) for r in rows):
        out.append(
            f"The recipe's KV format {mine} was not probed: add it with `trtkv probe {recipe.name} "
            f"--formats {mine}`."
        )
    if longest < recipe.build.max_seq_len:
        out.append(
            f"Probed up to {longest} tokens but build.max_seq_len is {recipe.build.max_seq_len}: "
            "error grows with context, probe longer if the model allows."
        )
    where = f" of recipe {data.recipe} (same model)" if data.recipe != recipe.name else ""
    return (
        out,
        f"measured by `trtkv probe`{where} on this model ({len(records)} records, "
        f"{folder / 'probe.json'})",
    )


# ----------------------------------------------------------------------------- the recipe's and the
# engines' formats


def recipe_probe_format(recipe: Recipe) -> str:
    """The probe's name for the format the recipe deploys: its kv_cache where the probe knows it
    (fp8_attn_head, not the fp8 storage it shares; fp8_cast, int8_per_token_head, ...), else the
    storage format (bf16 for none); fp8_cast where the engine runs FP8 KV at scale 1.0 whatever
    scales the checkpoint holds (trtkv.recipe.stored.engine_unit_scale)."""
    from trtkv.kvcache.names import all_format_names
    from trtkv.recipe.stored import engine_unit_scale

    kv = recipe.quantization.kv_cache.value
    if engine_unit_scale(recipe):
        return "fp8_cast"
    return kv if kv in all_format_names() else recipe.kv_format.value


def _same_format(a: str, b: str) -> bool:
    """Two probe names of one format (fp8_cast and fp8_scale1: one row of kv_formats.json)."""
    row = load_table().for_probe(a)
    return a == b or (row is not None and row is load_table().for_probe(b))


def engine_format_notes(records: list[ProbeRecord]) -> list[str]:
    """Sentences comparing engine formats that were both measured here (nothing when one of a pair
    is missing): vLLM's int8_per_token_head vs static INT8 (TensorRT-LLM's int8_kv_cache),
    ModelOpt's default fp8_cast vs calibrated fp8, vLLM's per-head fp8_attn_head vs per-layer fp8.
    Engine names and versions come from trtkv/data/kv_formats.json, every figure from the
    records."""
    by: dict[str, list[ProbeRecord]] = {}
    for r in records:
        by.setdefault(r.format, []).append(r)
    for rows in by.values():
        rows.sort(key=lambda r: r.context_len)
    out = []
    dyn, static = by.get("int8_per_token_head"), by.get("int8")
    if dyn and static:
        d, s = dyn[-1], static[-1]
        n = d.context_len
        vllm = load_table().engine_rows("int8_per_token_head", "vllm")
        trt = load_table().engine_rows("int8", "tensorrt_llm")
        where = (
            f"vLLM >= {min(e.version for e in vllm)} (`{vllm[0].config} {vllm[0].value}`)"
            if vllm
            else "vLLM"
        )
        static_name = (
            f"static INT8 (TensorRT-LLM {trt[0].version} `{trt[0].config}`)"
            if trt
            else "static INT8"
        )
        clipped = [r for r in static if (r.clip_rate or 0.0) > 0]
        clip = (
            f"; {static_name} clips {clipped[0].clip_rate:.2e} of K/V elements at "
            f"{clipped[0].context_len} tokens and beyond on this model (measured)"
            if clipped
            else f"; {static_name} clipped nothing up to {s.context_len} tokens here (measured)"
        )
        if d.kl_mean < s.kl_mean:
            head = f"On {where}, `int8_per_token_head` is the INT8 to use"
        else:
            head = f"On {where}, `int8_per_token_head` did not beat static INT8 on this model"
        deploy = (
            " Deploy it with quantization.kv_cache: int8_per_token_head and build.backend: vllm."
            if d.kl_mean < s.kl_mean
            else ""
        )
        out.append(
            f"{head}: KL {d.kl_mean:.5f} vs {s.kl_mean:.5f} for {static_name} at {n} tokens, "
            f"{d.kv_bytes_per_token:.0f} vs {s.kv_bytes_per_token:.0f} B/token{clip}.{deploy}"
        )
    cast = by.get("fp8_cast") or by.get("fp8_scale1")
    calibrated = by.get("fp8")
    if cast and calibrated:
        c, f = cast[-1], calibrated[-1]
        mo = load_table().engine_rows("fp8_cast", "modelopt")
        flag = (
            f" (ModelOpt {mo[0].version} `{mo[0].config.split(' ')[0]} {mo[0].value}`, scale "
            "1.0, no calibration)"
            if mo
            else ""
        )
        if c.kl_mean > f.kl_mean:
            cost = (
                f"costs KL {c.kl_mean:.5f} vs {f.kl_mean:.5f} for calibrated `fp8` "
                f"(+{c.kl_mean - f.kl_mean:.5f}"
            )
            cost += f", x{c.kl_mean / f.kl_mean:.1f})" if f.kl_mean > 0 else ")"
        else:
            cost = f"costs nothing over calibrated `fp8` (KL {c.kl_mean:.5f} vs {f.kl_mean:.5f})"
        out.append(
            f"ModelOpt's default `fp8_cast`{flag} {cost} at {c.context_len} tokens on this model "
            f"(measured); top-1 agreement {c.top1_agreement:.1%} vs {f.top1_agreement:.1%}."
        )
    per_head = by.get("fp8_attn_head")
    if per_head and calibrated:
        h, f = per_head[-1], calibrated[-1]
        vllm = load_table().engine_rows("fp8_attn_head", "vllm")
        where = (
            f"vLLM {vllm[0].version} (`{vllm[0].config} {vllm[0].value}` with k/v scales per "
            "KV head)"
            if vllm
            else "vLLM"
        )
        verb = "beats" if h.kl_mean < f.kl_mean else "does not beat"
        deploy = (
            " Deploy it with quantization.kv_cache: fp8_attn_head and build.backend: vllm "
            "(FlashAttention 3/4: H100, H200, B200)."
            if h.kl_mean < f.kl_mean
            else ""
        )
        out.append(
            f"Per-head static FP8 scales `fp8_attn_head` on {where} {verb} per-layer `fp8` on this "
            f"model: KL {h.kl_mean:.5f} vs {f.kl_mean:.5f} at {h.context_len} tokens (measured), "
            f"top-1 agreement {h.top1_agreement:.1%} vs {f.top1_agreement:.1%}.{deploy}"
        )
    return out


def per_layer_advice(recipe: Recipe, probe_dir: Path | None = None) -> str | None:
    """One advice line from `trtkv probe --per-layer` (per_layer_<format>.json) for the recipe's KV
    format, when it recommends something other than the uniform format: layers kept in 16 bit, or
    another format an engine serves."""
    import json

    folder = Path(probe_dir) if probe_dir is not None else probe_dir_of(recipe)
    source = folder / f"per_layer_{recipe.kv_format.value}.json"
    try:
        doc = json.loads(source.read_text())
    except (OSError, ValueError):
        return None
    best = doc.get("recommended") if isinstance(doc, dict) else None
    if not best or best.get("label") == doc["uniform"]["label"]:
        return None
    u, deploy = doc["uniform"], doc.get("deploy") or {}
    served = deploy.get("served_by", "?")
    cost = (
        f"costs {best['bytes_per_token'] / u['bytes_per_token'] - 1:+.0%} bytes/token and leaves "
        f"{best['kl_longest'] / u['kl_longest']:.0%} of uniform {doc['format']}'s KL at "
        f"{doc['longest_length']} tokens (measured)"
    )
    if best.get("keep"):
        have = list(recipe.quantization.kv_skip_layers)
        tail = (
            "the recipe already keeps them"
            if have == best["keep"]
            else f"set quantization.kv_skip_layers={best['keep']} (served by {served})"
        )
        return (
            f"Per-layer probe ({source}): keeping layers {best['keep']} in {doc['keep_format']} "
            f"{cost}: {tail}."
        )
    return (
        f"Per-layer probe ({source}): uniform {best['label']} {cost}: set quantization.kv_cache="
        f"{deploy.get('quantization.kv_cache', best['label'])} (served by {served})."
    )
