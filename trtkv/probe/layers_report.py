"""The per-layer analysis' report (trtkv.probe.layers): the summary line, per_layer_<format>.md and
its plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtkv.probe.serving import served_by


def summary_line(doc: dict[str, Any]) -> str:
    """What to deploy within the budget (and what would be better if an engine served it)."""
    u, best, lng = doc["uniform"], doc["recommended"], doc["longest_length"]
    if best is None:
        return f"  no configuration an engine serves meets the budget {doc['budget']}"
    ratio = best["kl_longest"] / u["kl_longest"] if u["kl_longest"] else float("nan")
    held = f" held at {lng}" if doc.get("windowed") else ""
    cost = (
        f"{best['bytes_per_token']:,.0f} B/token{held} "
        f"({best['bytes_per_token'] / u['bytes_per_token'] - 1:+.1%} vs uniform {u['label']})"
    )
    served = doc.get("deploy", {}).get("served_by", "")
    if best is u:
        line = (
            f"  recommended: uniform {u['label']} (nothing an engine serves within {doc['budget']} "
            f"beats it: KL {u['kl_longest']:.4g} at {lng}); served by {served}"
        )
    elif best.get("skip"):
        line = (
            f"  recommended: keep layers {best['skip']} in {doc['keep_format']}: {cost}, KL at "
            f"{lng} {best['kl_longest']:.4g} = {ratio:.0%} of uniform's {u['kl_longest']:.4g}; "
            f"deploy: quantization.kv_skip_layers={best['skip']}, served by {served}"
        )
    else:
        line = (
            f"  recommended: {best['label']}: {cost}, KL at {lng} {best['kl_longest']:.4g} = "
            f"{ratio:.0%} of uniform {u['label']}'s; deploy: "
            f"quantization.kv_cache={doc['deploy'].get('quantization.kv_cache')}, served by "
            f"{served}"
        )
    other = doc.get("best_not_served")
    if other is not None:
        line += (
            f"\n  better but served by no engine: {other['label']} "
            f"({other['bytes_per_token']:,.0f} B/token, KL at {lng} {other['kl_longest']:.4g}): "
            f"{next(iter(other['serving']['why_not'].values()), '')}"
        )
    return line


def markdown(doc: dict[str, Any]) -> str:
    s, lng = doc["sweep_length"], doc["longest_length"]
    win = doc.get("windowed")
    lines = [
        f"# Per-layer KV precision: {doc['recipe']}, {doc['format']} (layers kept in "
        f"{doc['keep_format']})",
        "",
        *(line.strip() for line in summary_line(doc).splitlines()),
        "",
        f"## Sensitivity at {s} tokens (KL to the fp16-KV reference)",
        "",
        "| layer | attention | KL only this layer | KL all but this | gain | K/V range | K "
        "outlier ch. | clip rate |",
        "|---|---|---|---|---|---|---|---|",
    ]
    if win:
        lines[-4] = (
            f"## Sensitivity at {s} tokens (KL to the fp16-KV reference, at "
            f"{win['sensitivity_rows']} evenly spaced positions)"
        )
    for r in doc["layers"]:
        ratio = r.get("k_over_v_range")
        clip = r.get("clip_rate")
        lines.append(
            f"| {r['layer']} | {r.get('attention', 'full')} | {r['kl_only']:.3g} | "
            f"{r['kl_all_but']:.3g} | {r['gain']:.3g} | {'' if ratio is None else f'{ratio:.1f}x'} "
            f"| {r.get('k_outlier_channels', '')} | {'' if clip is None else f'{clip:.2e}'} |"
        )
    if win:
        lines += _by_length_table(doc)
    bytes_head = f"KV bytes/token held at {lng}" if win else "bytes/token"
    lines += [
        "",
        f"## Configurations (verified at {lng} tokens; KL at {s} from the same pass)",
        "",
        f"| configuration | {bytes_head} | predicted KL@{s} | KL@{s} | KL@{lng} | top-1@{lng} | "
        "front: KL / top-1 / KL among served | served by |",
        "|---|---|---|---|---|---|---|---|",
    ]
    needle_n = str(max(doc["needle_lengths"])) if doc.get("needle_lengths") else None
    if needle_n:
        lines[-2] = lines[-2].replace(" | served by |", f" | needle@{needle_n} | served by |")
        lines[-1] += "---|"
    front, front1 = set(doc["front_longest"]), set(doc.get("front_longest_top1", []))
    served_front = set(doc.get("front_longest_served", []))
    for p in doc["points"]:
        pred = p.get("predicted_kl_sweep")
        marks = " / ".join(
            "yes" if p["label"] in f else "no" for f in (front, front1, served_front)
        )
        lines.append(
            f"| {p['label']} | {p['bytes_per_token']:,.0f} | "
            f"{'' if pred is None else f'{pred:.4g}'} | {p['kl_sweep']:.4g} | "
            f"{p['kl_longest']:.4g} | {p['top1_longest']:.4f} | {marks} | "
            + (_fmt_needle((p.get("needle") or {}).get(needle_n)) + " | " if needle_n else "")
            + f"{served_by(p.get('serving') or {}, doc.get('gpus_usable'))} |"
        )
    if needle_n:
        lines += [
            "",
            f"Needle: passkey retrieval at {needle_n} tokens "
            f"({', '.join(doc.get('front_needle') or [])} on its bytes-vs-needle front); other "
            "formats' figures from probe.json where it has that length.",
        ]
    lines += [
        "",
        "Served by: the engine backends whose rules (`trtkv build`'s) accept the configuration "
        "for this recipe, on every GPU where its model and weights run "
        f"({', '.join(doc.get('gpus_usable') or [])}) unless GPUs are named.",
        "",
        "## Method",
        "",
        doc["method"].strip(),
        "",
    ]
    return "\n".join(lines)


def _by_length_table(doc: dict[str, Any]) -> list[str]:
    """A windowed model: uniform vs the sliding layers kept vs the full layers kept vs all-16-bit,
    at every length the verification passes measured, with the KV bytes a sequence of that length
    holds."""
    win, fmt = doc["windowed"], doc["format"]
    rows = [
        doc["uniform"],
        doc["sets"].get("sliding_window"),
        doc["sets"].get("full_attention"),
        doc["all_16bit"],
    ]
    lengths = [n for n in map(str, doc["lengths"]) if n in doc["uniform"].get("kl_by_length", {})]
    out = [
        "",
        f"## Uniform {fmt} vs the {len(win['sliding_layers'])} sliding layers kept vs the "
        f"{len(win['full_layers'])} full-attention layers kept ({win['full_layers']}) vs all "
        f"{doc['keep_format']}",
        "",
        "KL to the fp16-KV reference (top-1 agreement) by context length, one pass at "
        f"{doc['longest_length']} each; KV bytes/token held at {doc['longest_length']} (a sliding "
        f"layer holds its {win['sliding_window']}-token window).",
        "",
        "| configuration | KV bytes/token | " + " | ".join(f"KL@{n}" for n in lengths) + " |",
        "|---|---|" + "---|" * len(lengths),
    ]
    for p in (r for r in rows if r is not None):
        cells = " | ".join(
            f"{p['kl_by_length'][n]:.4g} ({p['top1_by_length'][n]:.3f})" for n in lengths
        )
        out.append(f"| {p['label']} | {p['bytes_per_token']:,.0f} | {cells} |")
    return out


def _fmt_needle(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = doc["layers"]
    xs = [r["layer"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    ax = axes[0]
    ax.bar(
        [x - 0.2 for x in xs],
        [r["kl_only"] for r in rows],
        width=0.4,
        label="only this layer quantized",
    )
    ax.bar(
        [x + 0.2 for x in xs],
        [max(r["gain"], 0.0) for r in rows],
        width=0.4,
        label="gain from keeping it",
    )
    ax.set(
        xlabel="layer",
        ylabel=f"KL @ {doc['sweep_length']}",
        title=f"{doc['format']}: per-layer sensitivity",
    )
    ax.legend(fontsize=8)
    ax = axes[1]
    ax.plot(xs, [r.get("k_over_v_range") or 0 for r in rows], "o-", label="K range / V range")
    ax.plot(xs, [r.get("k_outlier_channels") or 0 for r in rows], "s-", label="K outlier channels")
    ax.set(xlabel="layer", title="K/V statistics (calibration pass)")
    if any(r.get("clip_rate") for r in rows):
        twin = ax.twinx()
        twin.plot(
            xs, [r.get("clip_rate") or 0 for r in rows], "^:", color="tab:red", label="clip rate"
        )
        twin.set_ylabel("clip rate")
    ax.legend(fontsize=8)
    ax = axes[2]
    for p in doc["points"]:
        ax.scatter(p["bytes_per_token"], p["kl_longest"], label=p["label"])
    front = sorted(
        (p for p in doc["points"] if p["label"] in doc["front_longest"]),
        key=lambda p: p["bytes_per_token"],
    )
    ax.plot([p["bytes_per_token"] for p in front], [p["kl_longest"] for p in front], "k--", lw=0.8)
    ax.set(
        xlabel="KV bytes per token",
        ylabel=f"KL @ {doc['longest_length']}",
        yscale="log",
        title="front",
    )
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
