"""PNG plots: latency distributions per level, throughput vs concurrency (or rate), accuracy per
task, ITL against input length (the input sweep, one line per recipe or level)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtkv.contracts.bench_doc import BenchLevel, RequestRecord, SweepLevel, TaskScore


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt: Any, fig: Any, path: Path) -> bool:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def latency_distributions(path: Path, by_level: dict[str, list[RequestRecord]]) -> bool:
    """Box plots of TTFT, ITL and request latency (ms) for each level, ok requests only."""
    if not by_level:
        return False
    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    metrics = (
        ("time to first token (ms)", RequestRecord.ttft_ms),
        ("inter-token latency (ms)", RequestRecord.itl_ms),
        ("request latency (ms)", RequestRecord.request_latency_ms),
    )
    labels = list(by_level)
    for ax, (title, fn) in zip(axes, metrics, strict=True):
        data = [
            [v for v in (fn(r) for r in recs if r.ok) if v is not None] or [float("nan")]
            for recs in by_level.values()
        ]
        ax.boxplot(data, showfliers=True)
        ax.set_xticks(range(1, len(labels) + 1), labels, rotation=20, fontsize=8)
        ax.set_title(title)
        ax.grid(alpha=0.3)
    return _save(plt, fig, path)


def throughput(
    path: Path, levels: dict[str, BenchLevel], x_values: list[float], x_label: str
) -> bool:
    """Output tokens/s and requests/s against concurrency (or offered rate), with p99 TTFT on the
    side."""
    if not levels:
        return False
    plt = _plt()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    summaries = list(levels.values())
    ax1.plot(
        x_values,
        [getattr(s.output_token_throughput, "avg", None) for s in summaries],
        "o-",
        label="output tokens/s",
    )
    ax1b = ax1.twinx()
    ax1b.plot(
        x_values,
        [getattr(s.request_throughput, "avg", None) for s in summaries],
        "s--",
        color="tab:orange",
        label="requests/s",
    )
    ax1.set_xlabel(x_label)
    ax1.set_ylabel("output tokens/s")
    ax1b.set_ylabel("requests/s")
    ax1.set_title("throughput")
    ax1.grid(alpha=0.3)
    for stat in ("p50", "p99"):
        ax2.plot(
            x_values,
            [getattr(s.time_to_first_token, stat, None) for s in summaries],
            "o-",
            label=f"TTFT {stat}",
        )
        ax2.plot(
            x_values,
            [getattr(s.request_latency, stat, None) for s in summaries],
            "s--",
            label=f"latency {stat}",
        )
    ax2.set_xlabel(x_label)
    ax2.set_ylabel("ms")
    ax2.set_title("latency")
    ax2.legend(fontsize=8)
    ax2.grid(alpha=0.3)
    return _save(plt, fig, path)


def accuracy(path: Path, acc: dict[str, TaskScore]) -> bool:
    """One bar per task figure (quiz accuracy, golden agreement and exact match, needle accuracy per
    context)."""
    figures: list[tuple[str, float | None]] = []
    for task, data in acc.items():
        if data.error is not None:
            continue
        if task == "golden":
            figures += [("golden agreement", data.agreement), ("golden exact", data.exact_match)]
        elif task == "needle":
            figures += [(f"needle @{k}", v) for k, v in (data.by_context_length or {}).items()]
        else:
            figures.append((f"{task} accuracy", data.accuracy))
    bars = [(name, v) for name, v in figures if v is not None]  # a figure not written: no bar
    if not bars:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(5, 1.3 * len(bars)), 3.5))
    ax.bar([b[0] for b in bars], [b[1] for b in bars], color="tab:green")
    for i, (_, v) in enumerate(bars):
        ax.text(i, v + 0.02, f"{v:.2f}", ha="center", fontsize=9)
    ax.set_ylim(0, 1.1)
    ax.set_ylabel("fraction")
    ax.set_title("accuracy per task")
    ax.tick_params(axis="x", labelrotation=15, labelsize=8)
    return _save(plt, fig, path)


def itl_vs_input(
    path: Path, series: dict[str, SweepLevel], title: str = "ITL vs input length"
) -> bool:
    """Median ITL (points) and its fitted line per series (a recipe, or a level), against input
    tokens."""
    series = {k: v for k, v in series.items() if v.input_tokens}
    if not series:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, s in series.items():
        line = ax.plot(s.input_tokens, s.itl_p50_ms, "o", label=f"{name} (median per length)")[0]
        if fit := s.itl_fit:
            xs = [min(s.input_tokens), max(s.input_tokens)]
            ax.plot(
                xs,
                [fit["slope"] * x + fit["intercept"] for x in xs],
                "-",
                color=line.get_color(),
                label=f"{name}: {fit['slope']:.3g} ms/token x input + {fit['intercept']:.3g} ms",
            )
    ax.set_xlabel("input tokens")
    ax.set_ylabel("inter-token latency (ms)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(plt, fig, path)
