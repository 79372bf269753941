"""What `trtkv probe` writes: probe.json, probe.md (method, results table, needles, scale reuse, K/V
statistics and one verdict per format), the PNG plots and the folder's manifest.json. The planner
reads them back through trtkv.measures.probe_results.

No torch here either; matplotlib is imported only when plots are written.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtkv.measures.probe_results import classify, engine_format_notes, needle_by_format

if TYPE_CHECKING:
    from trtkv.contracts.probe_doc import ProbeDoc


def write_outputs(
    out: Path, doc: dict, stats_markdown: str | None, curves: dict[str, list[float] | None]
) -> None:
    """probe.json, probe.md, the PNG plots and the folder's manifest.json (its wall time reaches the
    report)."""
    from trtkv.contracts.artifacts import Manifest
    from trtkv.contracts.probe_doc import ProbeDoc

    curves = {k: v for k, v in curves.items() if v}
    doc = {**doc, "kl_by_position": {"window": 256, "curves": curves}}
    from trtkv.probe.plots import write_plots

    probe = ProbeDoc.model_validate(doc)
    plots = write_plots(out, probe)
    probe.plots = [p.name for p in plots]
    probe.save(out)
    (out / "probe.md").write_text(render_markdown(probe, stats_markdown, plots))
    Manifest(
        stage="probe",
        recipe=doc.get("recipe"),
        key=None,
        wall_seconds=doc.get("seconds"),
        model=doc.get("model"),
        settings=doc.get("settings"),
        scales_source=(doc.get("scales") or {}).get("source"),
        versions=doc.get("versions"),
    ).save(out)


def _fmt(value: Any, spec: str, none: str = "-") -> str:
    return none if value is None else format(value, spec)


def render_markdown(probe: ProbeDoc, stats_markdown: str | None, plots: list[Path]) -> str:
    """probe.md: method, results table, needles, scale reuse, K/V statistics, one verdict per
    format."""
    recs, model, s = probe.records, probe.model, probe.settings
    lines = [
        f"# KV-cache probe: {probe.recipe}",
        "",
        f"Model {model.source} ({model.num_layers} layers, {model.num_kv_heads} KV heads x "
        f"head_dim {model.head_dim}), compute {model.compute_dtype} on {model.device}; "
        "text: calibration_data/eval (never used for calibration). Static scales: "
        f"{probe.scales.source if probe.scales else 'none'}. Run {probe.created_at}, "
        f"{probe.seconds:.0f} s.",
        "",
        "## Method",
        "",
        "- Reference: the same model with K/V stored in 16 bit "
        f"(`{probe.reference}`); its KL is 0 by construction.",
        "- Each query attends to the quantized K/V of every position up to and including its own, "
        "as a decode step reads back the cache it just wrote. Per-token formats quantize each "
        "token on its own, so one causal pass over the text gives exactly what token-by-token "
        "decoding would. KIVI keeps a 128-token fp16 window whose content depends on the query "
        "position, so its text is fed in 128-token chunks aligned with the window flushes (each "
        "token sees quantized history + full-precision window, as in decoding). Real runtimes "
        "attend the prompt in 16 bit during prefill, so these figures are the decode-side (worst) "
        "case.",
        "- One pass at the longest length serves every shorter length (a causal pass over L tokens "
        "is a prefix of the longer one); metrics at length L average the L-1 next-token "
        "predictions.",
        f"- Needles: a random 5-digit passkey at depths {s.needle_depths} of a haystack of "
        f"other eval text, {s.needle_seeds} seeds per depth, at lengths {s.needle_lengths}; "
        "counted when the greedy prediction of every digit is right (teacher-forced, equal to "
        "greedy generation).",
        "",
        "## Results",
        "",
        "| format | context | KL mean | KL last 1/4 | ppl | ppl delta | top-1 agree | needle | "
        "clip rate | bytes/token (measured) | formula |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    order = {f: i for i, f in enumerate(s.formats)}
    for r in sorted(recs, key=lambda r: (order.get(r.format, 99), r.context_len)):
        lines.append(
            f"| {r.format} | {r.context_len} | {r.kl_mean:.5f} | {r.kl_last_quarter:.5f} | "
            f"{r.ppl:.3f} | {r.ppl_delta:+.3f} | {r.top1_agreement:.1%} | "
            f"{_fmt(r.needle_accuracy, '.0%')} | {_fmt(r.clip_rate, '.2e')} | "
            f"{r.kv_bytes_per_token:.0f} | {r.kv_bytes_per_token_formula:.0f} |"
        )
    lines += ["", *[f"![{p.stem}]({p.name})" for p in plots], ""]
    # light: no torch
    from trtkv.measures.probe_attention import markdown_section as attention_section

    lines += attention_section(probe)
    lines += _needle_section(probe)
    from trtkv.probe.ruler import markdown_section  # light: no torch

    lines += markdown_section(probe)
    lines += _reuse_section(probe)
    lines += ["## Verdicts", ""]
    lines += [f"- {v}" for v in verdicts(probe)]
    lines += ["", "## Which runtime each format follows", "", "| format | semantics |", "|---|---|"]
    seen = []
    for r in recs:
        if r.format not in seen:
            seen.append(r.format)
            lines.append(f"| {r.format} | {r.kv_semantics} |")
    if stats_markdown:
        lines += ["", "## K/V statistics (calibration pass)", "", stats_markdown]
    return "\n".join(lines) + "\n"


def _needle_section(probe: ProbeDoc) -> list[str]:
    rows = probe.needles
    if not rows:
        return []
    depths = sorted({d for r in rows for d in r.by_depth}, key=float)
    lines = [
        "## Needle retrieval",
        "",
        "| format | context | " + " | ".join(f"depth {d}" for d in depths) + " | all |",
        "|---|---:|" + "---:|" * (len(depths) + 1),
    ]
    for r in rows:
        cells = " | ".join(_fmt(r.by_depth.get(d), ".0%") for d in depths)
        lines.append(f"| {r.format} | {r.context_len} | {cells} | {r.accuracy:.0%} |")
    return lines + [""]


def _reuse_section(probe: ProbeDoc) -> list[str]:
    reuse = probe.scale_reuse
    if reuse is None or not (reuse.formats or reuse.decode):
        return []
    lines = [
        "## Scale reuse: short-prompt scales at long context and through decode",
        "",
        f"Scales: {reuse.scales_source}. Range = the static format's representable |x| "
        f"(fp8: 448 x scale, int8: 127 x scale).",
        "",
        "| format | layers K beyond range | layers V beyond range | max K observed/range | max V "
        "observed/range |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, f in reuse.formats.items():
        lines.append(
            f"| {name} | {f.layers_exceeding_range_k} | {f.layers_exceeding_range_v} | "
            f"{f.max_observed_over_range_k:.2f} | {f.max_observed_over_range_v:.2f} |"
        )
    if any(f.by_position for f in reuse.formats.values()):
        lines += [
            "",
            "Clipping and KL by position (error growth along the text):",
            "",
            "| format | positions | clipped elements | KL mean |",
            "|---|---|---:|---:|",
        ]
        for name, f in reuse.formats.items():
            for b in f.by_position:
                lines.append(
                    f"| {name} | {b.from_}-{b.to} | {b.clipped_elements} | {b.kl_mean:.5f} |"
                )
    if reuse.decode:
        lines += [
            "",
            "Through decode steps (prompt of eval text, then greedy tokens of the reference fed "
            "one at a time through the quantized cache):",
            "",
            "| format | prompt | steps | clip rate prompt | clip rate decode | KL decode 1st half "
            "| KL decode 2nd half |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for name, d in reuse.decode.items():
            lines.append(
                f"| {name} | {d.prompt_tokens} | {d.decode_steps} | "
                f"{d.clip_rate_prompt:.2e} | {d.clip_rate_decode:.2e} | "
                f"{d.kl_decode_first_half:.5f} | {d.kl_decode_second_half:.5f} |"
            )
    return lines + [""]


def verdicts(probe: ProbeDoc) -> list[str]:
    """One paragraph per format from the measured records."""
    recs = probe.records
    needles = needle_by_format(probe)
    ref = probe.reference
    ref_needle = needles.get(ref)
    ref_bytes = next((r.kv_bytes_per_token for r in recs if r.format == ref), 1.0)
    out = []
    for fmt in probe.settings.formats:
        rows = sorted((r for r in recs if r.format == fmt), key=lambda r: r.context_len)
        if not rows:
            continue
        lo, hi = rows[0], rows[-1]
        if fmt == ref:
            out.append(
                f"**{fmt}**: the reference (KL 0 by construction); ppl {hi.ppl:.3f} at "
                f"{hi.context_len} tokens, needle {_fmt(needles.get(fmt), '.0%')}."
            )
            continue
        verdict = classify(hi.model_copy(update={"needle_accuracy": needles.get(fmt)}), ref_needle)
        growth = f"x{hi.kl_mean / lo.kl_mean:.1f}" if lo.kl_mean > 0 else "from 0"
        clip = (
            f" Static-scale clipping {hi.clip_rate:.2e} of elements."
            if hi.clip_rate is not None
            else ""
        )
        needle = needles.get(fmt)
        needle_txt = (
            f" Needle {needle:.0%} (reference {_fmt(ref_needle, '.0%')})."
            if needle is not None
            else ""
        )
        rel = hi.ppl_delta / hi.ppl_ref if hi.ppl_ref else 0.0
        share = hi.kv_bytes_per_token / max(1.0, ref_bytes)
        out.append(
            f"**{fmt}** ({hi.kv_bytes_per_token:.0f} B/token, {share:.0%} of fp16): KL "
            f"{lo.kl_mean:.4f} at {lo.context_len} -> {hi.kl_mean:.4f} at "
            f"{hi.context_len} tokens ({growth}; last quarter {hi.kl_last_quarter:.4f}), "
            f"top-1 agreement {hi.top1_agreement:.1%}, ppl {hi.ppl_delta:+.3f} "
            f"({rel:+.1%}).{clip}{needle_txt} Verdict: **{verdict}** on this model up to "
            f"{hi.context_len} tokens."
        )
    return out + engine_format_notes(recs)
