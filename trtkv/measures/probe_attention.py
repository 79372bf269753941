"""probe.md's attention sections and the printed lines: cache-only vs engine attention side by side
per format and length, and the prefill-vs-decode drift. Light (no torch): the planner's advice reads
it too."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trtkv.contracts.probe_doc import ProbeDoc, ProbeRecord

CACHE_ONLY = "cache_only"


def pairs(doc: ProbeDoc) -> list[tuple[ProbeRecord, ProbeRecord]]:
    """(cache-only record, engine-attention record) of the same format and length, in the document's
    order."""
    base = {(r.format, r.context_len): r for r in doc.records}
    return [
        (base[(r.format, r.context_len)], r)
        for r in doc.attention_records
        if (r.format, r.context_len) in base
    ]


def _ratio(a: float, b: float) -> str:
    return f"x{b / a:.2f}" if a > 0 else "-"


def markdown_section(doc: ProbeDoc) -> list[str]:
    """The side-by-side table and the drift table (nothing when only cache-only was measured)."""
    reasons = doc.attention.reasons if doc.attention else {}
    rows = pairs(doc)
    if not rows and not doc.drift:
        why = reasons.get(CACHE_ONLY, "")
        return [
            "## Attention",
            "",
            f"Measured cache-only only ({why})." if why else "Measured cache-only only.",
            "",
        ]
    lines = [
        "## Cache-only vs the engine's attention",
        "",
        "Cache-only: the stored cache dequantized into full-precision attention. Engine: the same "
        "cache read by the engine kernel's numerics (FP8 Q with its scale, FP8 P per KV tile; "
        "trtkv/data/kv_formats.json, section attention, names each kernel's source), every scored "
        "position through the decode kernel.",
        "",
    ]
    for mode, why in reasons.items():
        lines.append(f"- `{mode}`: {why}")
    lines += [
        "",
        "| format | context | attention | KL cache-only | KL engine | engine / cache-only | top-1 "
        "cache-only | top-1 engine | ppl delta cache-only | ppl delta engine |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for a, b in rows:
        lines.append(
            f"| {a.format} | {a.context_len} | {b.attention} | {a.kl_mean:.5f} | {b.kl_mean:.5f} | "
            f"{_ratio(a.kl_mean, b.kl_mean)} | {a.top1_agreement:.1%} | {b.top1_agreement:.1%} | "
            f"{a.ppl_delta:+.3f} | {b.ppl_delta:+.3f} |"
        )
    if doc.drift:
        lines += [
            "",
            "### Prefill vs decode",
            "",
            "A prompt prefilled by the prefill kernel, the next tokens teacher-forced one at a "
            "time through the decode kernel, against one prefill of the same text "
            "(log-probabilities of the text's tokens). Cache-only attention computes both the same "
            "way: its drift is 0 by construction.",
            "",
            "| format | attention | prompt | decoded | mean abs dlogp | max abs dlogp | KL | "
            "top-1 agree |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        for d in doc.drift:
            lines.append(
                f"| {d.format} | {d.attention} | {d.prompt_tokens} | {d.decode_steps} "
                f"| {d.mean_abs_dlogp:.5f} | {d.max_abs_dlogp:.4f} | {d.kl_mean:.2e} | "
                f"{d.top1_agreement:.1%} |"
            )
    return lines + [""]


def summary_lines(doc: ProbeDoc) -> list[str]:
    """Printed after the cache-only table: the engine's KL beside cache-only's, and the drift."""
    out = []
    width = max([11, *(len(a.format) for a, _ in pairs(doc))])
    for a, b in pairs(doc):
        out.append(
            f"  {a.format:>{width}} @ {a.context_len:>5}: KL cache-only {a.kl_mean:.5f}  "
            f"{b.attention} {b.kl_mean:.5f} ({_ratio(a.kl_mean, b.kl_mean)})  top-1 "
            f"{a.top1_agreement:.1%} / {b.top1_agreement:.1%}"
        )
    for d in doc.drift:
        out.append(
            f"  prefill vs decode {d.format} {d.attention}: mean |dlogp| {d.mean_abs_dlogp:.5f} "
            f"over {d.decode_steps} decoded tokens after {d.prompt_tokens}"
        )
    return out


def advice_lines(doc: ProbeDoc) -> list[str]:
    """The planner's sentence per format measured under the engine's attention, at the longest
    length."""
    rows = pairs(doc)
    if not rows:
        return []
    longest = max(a.context_len for a, _ in rows)
    return [
        f"{b.format} with {b.attention} attention (what the engine computes) at {longest} "
        f"tokens: KL {b.kl_mean:.4f} vs {a.kl_mean:.4f} for the stored cache alone "
        f"({_ratio(a.kl_mean, b.kl_mean)}), top-1 agreement {b.top1_agreement:.1%}."
        for a, b in rows
        if a.context_len == longest
    ]
