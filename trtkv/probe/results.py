"""Probe results on disk: read by the planner, written as probe.json / probe.md / PNG plots by `trtkv probe`.

No torch here: `trtkv plan` must start fast. matplotlib is imported only when plots are written.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtkv.core import paths
from trtkv.recipe.layout import probe_dir as probe_dir_of

if TYPE_CHECKING:
    from trtkv.recipe import Recipe

# Verdict thresholds at the longest probed length (top-1 agreement with the reference, relative ppl change).
SAFE_TOP1, SAFE_PPL = 0.97, 0.01
CAUTION_TOP1, CAUTION_PPL = 0.90, 0.05
NEEDLE_SLACK = 0.2  # needle accuracy may trail the reference by this much before it counts against a format


def _read(path: Path) -> dict | None:
    """A probe.json through its typed model (None when absent, unreadable or without records)."""
    from trtkv.contracts.artifacts import ProbeDoc
    from trtkv.core.errors import StageError

    try:
        doc = ProbeDoc.load(path.parent)
    except StageError:
        return None
    return doc.model_dump() if doc is not None and doc.records else None


def find_probe(recipe: Recipe, probe_dir: Path | None = None) -> tuple[Path, dict] | None:
    """The probe results for this recipe's model: probe_dir, else engines/<recipe>/probe, else the newest probe of
    another recipe with the same model source and architecture."""
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
        model = (other or {}).get("model", {})
        if other and model.get("source") == recipe.model.source and \
                model.get("num_layers") in (None, recipe.model.num_layers):
            found.append((path.stat().st_mtime, path.parent, other))
    if not found:
        return None
    _, folder, doc = max(found, key=lambda x: x[0])
    return folder, doc


def load_probe(recipe: Recipe, probe_dir: Path | None = None) -> dict | None:
    hit = find_probe(recipe, probe_dir)
    return hit[1] if hit else None


def summary_lines(records: list[dict]) -> list[str]:
    """`trtkv probe`'s printed table, one line per record; the format column as wide as the longest name."""
    width = max([11, *(len(r["format"]) for r in records)])
    lines = []
    for r in records:
        needle = r.get("needle_accuracy")
        lines.append(f"  {r['format']:>{width}} @ {r['context_len']:>5}: KL {r['kl_mean']:.5f}  top-1 "
                     f"{r['top1_agreement']:.1%}  ppl {r['ppl']:.3f} ({r['ppl_delta']:+.3f})  bytes/token "
                     f"{r['kv_bytes_per_token']:.0f}" + (f"  needle {needle:.0%}" if needle is not None else ""))
    return lines


def classify(rec: dict, ref_needle: float | None = None) -> str:
    """'safe', 'caution' or 'risky' for one record (top-1 agreement, relative ppl change, needle)."""
    rel = abs(rec.get("ppl_delta", 0.0)) / max(rec.get("ppl_ref") or rec.get("ppl") or 1.0, 1e-9)
    top1 = rec.get("top1_agreement", 0.0)
    needle = rec.get("needle_accuracy")
    needle_ok = needle is None or ref_needle is None or needle >= ref_needle - NEEDLE_SLACK
    if top1 >= SAFE_TOP1 and rel <= SAFE_PPL and needle_ok:
        return "safe"
    if top1 >= CAUTION_TOP1 and rel <= CAUTION_PPL:
        return "caution"
    return "risky"


def _needle_by_format(doc: dict) -> dict[str, float]:
    """Mean needle accuracy per format over the probed needle lengths."""
    acc: dict[str, list[float]] = {}
    for row in doc.get("needles", []):
        acc.setdefault(row["format"], []).append(row["accuracy"])
    return {f: sum(v) / len(v) for f, v in acc.items()}


def probe_advice(recipe: Recipe, probe_dir: Path | None = None) -> tuple[list[str], str] | None:
    """Advice built from measured probe records, or None when there are none for this model."""
    hit = find_probe(recipe, probe_dir)
    if hit is None:
        return None
    folder, data = hit
    records = data["records"]
    longest = max(r["context_len"] for r in records)
    needles = _needle_by_format(data)
    ref_needle = needles.get(data.get("reference", "fp16"))
    rows = sorted((r for r in records if r["context_len"] == longest), key=lambda r: r.get("kv_bytes_per_token", 0))
    out = []
    for r in rows:
        needle = needles.get(r["format"])
        needle_txt = f", needle {needle:.0%}" if needle is not None else ""
        out.append(f"{r['format']} at {longest} tokens: KL {r['kl_mean']:.4f}, top-1 agreement "
                   f"{r['top1_agreement']:.1%}, ppl delta {r['ppl_delta']:+.3f}{needle_txt} -> "
                   f"{classify({**r, 'needle_accuracy': needle}, ref_needle)}")
    safe = [r for r in rows if r["format"] not in ("fp16", "bf16")
            and classify({**r, "needle_accuracy": needles.get(r["format"])}, ref_needle) == "safe"]
    if safe:
        best = min(safe, key=lambda r: r.get("kv_bytes_per_token", 0))
        out.append(f"Smallest KV format measured safe on this model up to {longest} tokens: {best['format']} "
                   f"({best.get('kv_bytes_per_token', 0):.0f} B/token).")
    else:
        out.append(f"No quantized KV format measured safe up to {longest} tokens on this model: keep 16-bit KV.")
    out += engine_format_notes(records)
    from trtkv.probe.attention_report import advice_lines

    out += advice_lines(data)
    mine = recipe_probe_format(recipe)
    if mine and not any(_same_format(r["format"], mine) for r in rows):
        out.append(f"The recipe's KV format {mine} was not probed: add it with `trtkv probe {recipe.name} "
                   f"--formats {mine}`.")
    if longest < recipe.build.max_seq_len:
        out.append(f"Probed up to {longest} tokens but build.max_seq_len is {recipe.build.max_seq_len}: error grows "
                   f"with context, probe longer if the model allows.")
    other = data.get("recipe")
    where = f" of recipe {other} (same model)" if other and other != recipe.name else ""
    return out, f"measured by `trtkv probe`{where} on this model ({len(records)} records, {folder / 'probe.json'})"


# ----------------------------------------------------------------------------- writing the report


def write_outputs(out: Path, doc: dict, stats_markdown: str | None, curves: dict[str, list[float] | None]) -> None:
    """probe.json, probe.md, the PNG plots and the folder's manifest.json (its wall time reaches the report)."""
    from trtkv.contracts.artifacts import Manifest, ProbeDoc

    doc = {**doc, "kl_by_position": {"window": 256, "curves": {k: v for k, v in curves.items() if v}}}
    from trtkv.probe.plots import write_plots

    plots = write_plots(out, doc)
    doc["plots"] = [p.name for p in plots]
    ProbeDoc.model_validate(doc).save(out)
    (out / "probe.md").write_text(render_markdown(doc, stats_markdown, plots))
    Manifest(stage="probe", recipe=doc.get("recipe"), key=None, wall_seconds=doc.get("seconds"), model=doc.get("model"),
             settings=doc.get("settings"), scales_source=(doc.get("scales") or {}).get("source"),
             versions=doc.get("versions")).save(out)


def _fmt(value: Any, spec: str, none: str = "-") -> str:
    return none if value is None else format(value, spec)


def render_markdown(doc: dict, stats_markdown: str | None, plots: list[Path]) -> str:
    """probe.md: method, results table, needles, scale reuse, K/V statistics, one verdict per format."""
    recs = doc["records"]
    model = doc["model"]
    s = doc["settings"]
    lines = [
        f"# KV-cache probe: {doc['recipe']}",
        "",
        f"Model {model['source']} ({model['num_layers']} layers, {model['num_kv_heads']} KV heads x head_dim "
        f"{model['head_dim']}), compute {model['compute_dtype']} on {model['device']}; text: calibration_data/eval "
        f"(never used for calibration). Static scales: {doc['scales']['source']}. Run {doc['created_at']}, "
        f"{doc['seconds']:.0f} s.",
        "",
        "## Method",
        "",
        f"- Reference: the same model with K/V stored in 16 bit (`{doc.get('reference', 'fp16')}`); its KL is 0 by "
        "construction.",
        "- Each query attends to the quantized K/V of every position up to and including its own, as a decode step "
        "reads back the cache it just wrote. Per-token formats quantize each token on its own, so one causal pass over "
        "the text gives exactly what token-by-token decoding would. KIVI keeps a 128-token fp16 window whose content "
        "depends on the query position, so its text is fed in 128-token chunks aligned with the window flushes "
        "(each token sees quantized history + full-precision window, as in decoding). Real runtimes attend the prompt "
        "in 16 bit during prefill, so these figures are the decode-side (worst) case.",
        "- One pass at the longest length serves every shorter length (a causal pass over L tokens is a prefix of "
        "the longer one); metrics at length L average the L-1 next-token predictions.",
        f"- Needles: a random 5-digit passkey at depths {s['needle_depths']} of a haystack of other eval text, "
        f"{s['needle_seeds']} seeds per depth, at lengths {s['needle_lengths']}; counted when the greedy prediction "
        f"of every digit is right (teacher-forced, equal to greedy generation).",
        "",
        "## Results",
        "",
        "| format | context | KL mean | KL last 1/4 | ppl | ppl delta | top-1 agree | needle | clip rate | "
        "bytes/token (measured) | formula |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    order = {f: i for i, f in enumerate(s["formats"])}
    for r in sorted(recs, key=lambda r: (order.get(r["format"], 99), r["context_len"])):
        lines.append(
            f"| {r['format']} | {r['context_len']} | {r['kl_mean']:.5f} | {r['kl_last_quarter']:.5f} | "
            f"{r['ppl']:.3f} | {r['ppl_delta']:+.3f} | {r['top1_agreement']:.1%} | "
            f"{_fmt(r.get('needle_accuracy'), '.0%')} | {_fmt(r.get('clip_rate'), '.2e')} | "
            f"{r['kv_bytes_per_token']:.0f} | {r['kv_bytes_per_token_formula']:.0f} |")
    lines += ["", *[f"![{p.stem}]({p.name})" for p in plots], ""]
    from trtkv.probe.attention_report import markdown_section as attention_section  # light: no torch

    lines += attention_section(doc)
    lines += _needle_section(doc)
    from trtkv.probe.ruler import markdown_section  # light: no torch

    lines += markdown_section(doc)
    lines += _reuse_section(doc)
    lines += ["## Verdicts", ""]
    lines += [f"- {v}" for v in verdicts(doc)]
    lines += ["", "## Which runtime each format follows", "", "| format | semantics |", "|---|---|"]
    seen = []
    for r in recs:
        if r["format"] not in seen:
            seen.append(r["format"])
            lines.append(f"| {r['format']} | {r['kv_semantics']} |")
    if stats_markdown:
        lines += ["", "## K/V statistics (calibration pass)", "", stats_markdown]
    return "\n".join(lines) + "\n"


def _needle_section(doc: dict) -> list[str]:
    rows = doc.get("needles", [])
    if not rows:
        return []
    depths = sorted({d for r in rows for d in r["by_depth"]}, key=float)
    lines = ["## Needle retrieval", "", "| format | context | " + " | ".join(f"depth {d}" for d in depths) + " | all |",
             "|---|---:|" + "---:|" * (len(depths) + 1)]
    for r in rows:
        cells = " | ".join(_fmt(r["by_depth"].get(d), ".0%") for d in depths)
        lines.append(f"| {r['format']} | {r['context_len']} | {cells} | {r['accuracy']:.0%} |")
    return lines + [""]


def _reuse_section(doc: dict) -> list[str]:
    reuse = doc.get("scale_reuse") or {}
    fmts = reuse.get("formats", {})
    decode = reuse.get("decode", {})
    if not fmts and not decode:
        return []
    lines = ["## Scale reuse: short-prompt scales at long context and through decode", "",
             f"Scales: {reuse.get('scales_source')}. Range = the static format's representable |x| "
             f"(fp8: 448 x scale, int8: 127 x scale).", "",
             "| format | layers K beyond range | layers V beyond range | max K observed/range | max V observed/range |",
             "|---|---:|---:|---:|---:|"]
    for name, f in fmts.items():
        lines.append(f"| {name} | {f['layers_exceeding_range_k']} | {f['layers_exceeding_range_v']} | "
                     f"{f['max_observed_over_range_k']:.2f} | {f['max_observed_over_range_v']:.2f} |")
    if any(f.get("by_position") for f in fmts.values()):
        lines += ["", "Clipping and KL by position (error growth along the text):", "",
                  "| format | positions | clipped elements | KL mean |", "|---|---|---:|---:|"]
        for name, f in fmts.items():
            for b in f.get("by_position", []):
                lines.append(f"| {name} | {b['from']}-{b['to']} | {b['clipped_elements']} | {b['kl_mean']:.5f} |")
    if decode:
        lines += ["", "Through decode steps (prompt of eval text, then greedy tokens of the reference fed one at a "
                  "time through the quantized cache):", "",
                  "| format | prompt | steps | clip rate prompt | clip rate decode | KL decode 1st half | "
                  "KL decode 2nd half |", "|---|---:|---:|---:|---:|---:|---:|"]
        for name, d in decode.items():
            lines.append(f"| {name} | {d['prompt_tokens']} | {d['decode_steps']} | {d['clip_rate_prompt']:.2e} | "
                         f"{d['clip_rate_decode']:.2e} | {d['kl_decode_first_half']:.5f} | "
                         f"{d['kl_decode_second_half']:.5f} |")
    return lines + [""]


def verdicts(doc: dict) -> list[str]:
    """One paragraph per format from the measured records."""
    recs = doc["records"]
    needles = _needle_by_format(doc)
    ref = doc.get("reference", "fp16")
    ref_needle = needles.get(ref)
    out = []
    for fmt in doc["settings"]["formats"]:
        rows = sorted((r for r in recs if r["format"] == fmt), key=lambda r: r["context_len"])
        if not rows:
            continue
        lo, hi = rows[0], rows[-1]
        if fmt == ref:
            out.append(f"**{fmt}**: the reference (KL 0 by construction); ppl {hi['ppl']:.3f} at {hi['context_len']} "
                       f"tokens, needle {_fmt(needles.get(fmt), '.0%')}.")
            continue
        verdict = classify({**hi, "needle_accuracy": needles.get(fmt)}, ref_needle)
        growth = f"x{hi['kl_mean'] / lo['kl_mean']:.1f}" if lo["kl_mean"] > 0 else "from 0"
        clip = f" Static-scale clipping {hi['clip_rate']:.2e} of elements." if hi.get("clip_rate") is not None else ""
        needle = needles.get(fmt)
        needle_txt = f" Needle {needle:.0%} (reference {_fmt(ref_needle, '.0%')})." if needle is not None else ""
        rel = hi["ppl_delta"] / hi["ppl_ref"] if hi.get("ppl_ref") else 0.0
        share = hi["kv_bytes_per_token"] / max(1.0, _ref_bytes(recs, ref))
        out.append(
            f"**{fmt}** ({hi['kv_bytes_per_token']:.0f} B/token, {share:.0%} of fp16): KL {lo['kl_mean']:.4f} at "
            f"{lo['context_len']} -> {hi['kl_mean']:.4f} at {hi['context_len']} "
            f"tokens ({growth}; last quarter {hi['kl_last_quarter']:.4f}), top-1 agreement "
            f"{hi['top1_agreement']:.1%}, ppl {hi['ppl_delta']:+.3f} ({rel:+.1%}).{clip}{needle_txt} "
            f"Verdict: **{verdict}** on this model up to {hi['context_len']} tokens.")
    return out + engine_format_notes(recs)


def recipe_probe_format(recipe: Recipe) -> str:
    """The probe's name for the format the recipe deploys: its kv_cache where the probe knows it (fp8_attn_head, not the
    fp8 storage it shares; fp8_cast, int8_per_token_head, ...), else the storage format (bf16 for none)."""
    from trtkv.kvcache.names import all_format_names

    kv = recipe.quantization.kv_cache.value
    return kv if kv in all_format_names() else recipe.kv_format.value


def _same_format(a: str, b: str) -> bool:
    """Two probe names of one format (fp8_cast and fp8_scale1: one row of kv_formats.json)."""
    from trtkv.kvcache.engines import load_table

    row = load_table().for_probe(a)
    return a == b or (row is not None and row is load_table().for_probe(b))


def _engine_values(fmt: str, engine: str) -> list[tuple[str, str, str]]:
    """(version, config, value) of every row of `engine` that selects probe format `fmt` in kv_formats.json."""
    from trtkv.kvcache.engines import load_table

    row = load_table().for_probe(fmt)
    return [(e.version, e.config, e.value) for e in (row.engines if row else ()) if e.engine == engine]


def engine_format_notes(records: list[dict]) -> list[str]:
    """Sentences comparing engine formats that were both measured here (nothing when one of a pair is missing):
    vLLM's int8_per_token_head vs static INT8 (TensorRT-LLM's int8_kv_cache), ModelOpt's default fp8_cast vs calibrated
    fp8, vLLM's per-head fp8_attn_head vs per-layer fp8. Engine names and versions come from trtkv/data/kv_formats.json,
    every figure from the records."""
    by: dict[str, list[dict]] = {}
    for r in records:
        by.setdefault(r["format"], []).append(r)
    for rows in by.values():
        rows.sort(key=lambda r: r["context_len"])
    out = []
    dyn, static = by.get("int8_per_token_head"), by.get("int8")
    if dyn and static:
        d, s = dyn[-1], static[-1]
        n = d["context_len"]
        vllm = _engine_values("int8_per_token_head", "vllm")
        trt = _engine_values("int8", "tensorrt_llm")
        where = f"vLLM >= {min(v for v, _, _ in vllm)} (`{vllm[0][1]} {vllm[0][2]}`)" if vllm else "vLLM"
        static_name = f"static INT8 (TensorRT-LLM {trt[0][0]} `{trt[0][1]}`)" if trt else "static INT8"
        clipped = [r for r in static if (r.get("clip_rate") or 0.0) > 0]
        clip = (f"; {static_name} clips {clipped[0]['clip_rate']:.2e} of K/V elements at {clipped[0]['context_len']} "
                f"tokens and beyond on this model (measured)" if clipped else
                f"; {static_name} clipped nothing up to {s['context_len']} tokens here (measured)")
        if d["kl_mean"] < s["kl_mean"]:
            head = f"On {where}, `int8_per_token_head` is the INT8 to use"
        else:
            head = f"On {where}, `int8_per_token_head` did not beat static INT8 on this model"
        deploy = (" Deploy it with quantization.kv_cache: int8_per_token_head and build.backend: vllm."
                  if d["kl_mean"] < s["kl_mean"] else "")
        out.append(f"{head}: KL {d['kl_mean']:.5f} vs {s['kl_mean']:.5f} for {static_name} at {n} tokens, "
                   f"{d['kv_bytes_per_token']:.0f} vs {s['kv_bytes_per_token']:.0f} B/token{clip}.{deploy}")
    cast = by.get("fp8_cast") or by.get("fp8_scale1")
    calibrated = by.get("fp8")
    if cast and calibrated:
        c, f = cast[-1], calibrated[-1]
        mo = _engine_values("fp8_cast", "modelopt")
        flag = f" (ModelOpt {mo[0][0]} `{mo[0][1].split(' ')[0]} {mo[0][2]}`, scale 1.0, no calibration)" if mo else ""
        if c["kl_mean"] > f["kl_mean"]:
            cost = (f"costs KL {c['kl_mean']:.5f} vs {f['kl_mean']:.5f} for calibrated `fp8` "
                    f"(+{c['kl_mean'] - f['kl_mean']:.5f}")
            cost += f", x{c['kl_mean'] / f['kl_mean']:.1f})" if f["kl_mean"] > 0 else ")"
        else:
            cost = f"costs nothing over calibrated `fp8` (KL {c['kl_mean']:.5f} vs {f['kl_mean']:.5f})"
        out.append(f"ModelOpt's default `fp8_cast`{flag} {cost} at {c['context_len']} tokens on this model "
                   f"(measured); top-1 agreement {c['top1_agreement']:.1%} vs {f['top1_agreement']:.1%}.")
    per_head = by.get("fp8_attn_head")
    if per_head and calibrated:
        h, f = per_head[-1], calibrated[-1]
        vllm = _engine_values("fp8_attn_head", "vllm")
        where = f"vLLM {vllm[0][0]} (`{vllm[0][1]} {vllm[0][2]}` with k/v scales per KV head)" if vllm else "vLLM"
        verb = "beats" if h["kl_mean"] < f["kl_mean"] else "does not beat"
        deploy = (" Deploy it with quantization.kv_cache: fp8_attn_head and build.backend: vllm (FlashAttention 3/4: "
                  "H100, H200, B200)." if h["kl_mean"] < f["kl_mean"] else "")
        out.append(f"Per-head static FP8 scales `fp8_attn_head` on {where} {verb} per-layer `fp8` on this model: KL "
                   f"{h['kl_mean']:.5f} vs {f['kl_mean']:.5f} at {h['context_len']} tokens (measured), top-1 agreement "
                   f"{h['top1_agreement']:.1%} vs {f['top1_agreement']:.1%}.{deploy}")
    return out


def _ref_bytes(recs: list[dict], ref: str) -> float:
    return next((r["kv_bytes_per_token"] for r in recs if r["format"] == ref), 1.0)


def per_layer_advice(recipe: Recipe, probe_dir: Path | None = None) -> str | None:
    """One advice line from `trtkv probe --per-layer` (per_layer_<format>.json) for the recipe's KV format, when it
    recommends something other than the uniform format: layers kept in 16 bit, or another format an engine serves."""
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
    cost = (f"costs {best['bytes_per_token'] / u['bytes_per_token'] - 1:+.0%} bytes/token and leaves "
            f"{best['kl_longest'] / u['kl_longest']:.0%} of uniform {doc['format']}'s KL at {doc['longest_length']} "
            f"tokens (measured)")
    if best.get("keep"):
        have = list(recipe.quantization.kv_skip_layers)
        tail = ("the recipe already keeps them" if have == best["keep"] else
                f"set quantization.kv_skip_layers={best['keep']} (served by {served})")
        return f"Per-layer probe ({source}): keeping layers {best['keep']} in {doc['keep_format']} {cost}: {tail}."
    return (f"Per-layer probe ({source}): uniform {best['label']} {cost}: set quantization.kv_cache="
            f"{deploy.get('quantization.kv_cache', best['label'])} (served by {served}).")

