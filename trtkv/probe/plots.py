"""The probe's PNG plots (error vs context, KL by position, needle retrieval), written beside
probe.md."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trtkv.contracts.probe_doc import ProbeDoc


def write_plots(out: Path, doc: ProbeDoc) -> list[Path]:
    """Error vs context length, error vs position, needle accuracy by depth x length (PNG, Agg
    backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs, formats, ref = doc.records, doc.settings.formats, doc.reference
    written = []
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for fmt in formats:
        rows = sorted((r for r in recs if r.format == fmt), key=lambda r: r.context_len)
        if not rows or fmt == ref:
            continue
        xs = [r.context_len for r in rows]
        axes[0].plot(xs, [max(r.kl_mean, 1e-7) for r in rows], marker="o", label=fmt)
        axes[1].plot(xs, [r.top1_agreement for r in rows], marker="o", label=fmt)
    for ax, title in (
        (axes[0], "KL to fp16 reference (mean)"),
        (axes[1], "top-1 agreement with reference"),
    ):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context length (tokens)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].set_yscale("log")
    axes[1].legend(fontsize=8)
    fig.suptitle(f"KV format error vs context length: {doc.recipe}")
    fig.tight_layout()
    written.append(_save(fig, out / "error_vs_context.png", plt))
    by_position = doc.kl_by_position
    if by_position and by_position.curves:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        window = by_position.window
        for fmt, ys in by_position.curves.items():
            if fmt != ref and ys:
                ax.plot([i * window for i in range(len(ys))], [max(y, 1e-7) for y in ys], label=fmt)
        ax.set_yscale("log")
        ax.set_xlabel("position (tokens)")
        ax.set_ylabel(f"KL, mean over {window} positions")
        ax.set_title("Error along the text (growth with context)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        written.append(_save(fig, out / "kl_vs_position.png", plt))
    if doc.needles:
        written.append(_needle_plot(out, doc, plt))
    return written


def _needle_plot(out: Path, doc: ProbeDoc, plt: Any) -> Path:
    needles = doc.needles
    fmts = [f for f in doc.settings.formats if any(r.format == f for r in needles)]
    lengths = sorted({r.context_len for r in needles})
    depths = sorted({d for r in needles for d in r.by_depth}, key=float)
    fig, axes = plt.subplots(
        1, len(fmts), figsize=(2.2 * len(fmts) + 1, 2.2 + 0.3 * len(lengths)), squeeze=False
    )
    for ax, fmt in zip(axes[0], fmts, strict=False):
        grid = [
            [
                next(
                    (
                        r.by_depth.get(d, float("nan"))
                        for r in needles
                        if r.format == fmt and r.context_len == n
                    ),
                    float("nan"),
                )
                for d in depths
            ]
            for n in lengths
        ]
        ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
        ax.set_xticks(range(len(depths)), depths)
        ax.set_yticks(range(len(lengths)), lengths)
        ax.set_title(fmt, fontsize=9)
        ax.set_xlabel("depth")
        for i, row in enumerate(grid):
            for j, v in enumerate(row):
                ax.text(j, i, f"{v:.0%}", ha="center", va="center", fontsize=8)
    axes[0][0].set_ylabel("context")
    fig.suptitle("Needle (passkey) accuracy by depth x length")
    fig.tight_layout()
    return _save(fig, out / "needle.png", plt)


def _save(fig: Any, path: Path, plt: Any) -> Path:
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
