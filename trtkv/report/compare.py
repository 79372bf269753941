"""`trtkv compare`: several recipes side by side (compare.md, compare.json, compare.png), each
recipe's figures read by trtkv.report.summary.collect; accuracy differences called only where the
95% intervals separate; the input sweep's ITL fits and break-even lengths (`bench
--sweep-input`)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtkv.report.summary import ACCURACY_TASKS, collect, figure, with_ci

if TYPE_CHECKING:
    from trtkv.contracts.plan_figures import PlanFigures
    from trtkv.recipe import Recipe
    from trtkv.report.chain import ChainResult


# what `trtkv compare` writes (before 2026-12 into engines/compare/ in place, without an owner file)
COMPARE_FILES = frozenset({"compare.md", "compare.json", "compare.png"})


def compare_output(given: Path | None) -> Path:
    """The folder `trtkv compare` will replace (--output, default engines/compare), checked before
    any recipe runs: absent, empty, or trtkv's own compare output (its owner file, or only the files
    an earlier compare wrote); anything else, a recipe's folder named `compare` included, is
    refused."""
    from trtkv.contracts.outputs import check_inside, check_output
    from trtkv.core import paths

    out = given if given is not None else paths.engines_dir() / "compare"
    absolute = check_inside(out, "compare")
    if (
        given is None
        and absolute.is_dir()
        and 0 < len(names := {p.name for p in absolute.iterdir()})
    ):
        if names <= COMPARE_FILES and all((absolute / n).is_file() for n in names):
            return absolute
    return check_output(out, "compare", "compare")


def write_compare_folder(
    recipes: list[Recipe], plans: list[PlanFigures], results: list[ChainResult], out: Path
) -> Path:
    """compare.md/json/png written into a temporary sibling, swapped in whole for `out` (checked by
    compare_output) only once complete; returns compare.md."""
    import shutil

    from trtkv.contracts.outputs import OWNER, remove_leftovers, replace_folder
    from trtkv.core.paths import temp_sibling

    out.parent.mkdir(parents=True, exist_ok=True)
    remove_leftovers(out, lambda _m: None)
    tmp = temp_sibling(out, "tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        md = write_compare(recipes, plans, results, tmp)
        (tmp / OWNER).write_text(json.dumps({"stage": "compare", "recipe": "compare"}) + "\n")
        replace_folder(tmp, out, "compare")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out / md.name


def accuracy_difference(rows: list[dict[str, Any]], key: str) -> str:
    """How each recipe's figure compares with the first's: "higher"/"lower" only when the 95%
    intervals separate, "within noise" when they overlap, "no interval" when either lacks one."""
    from trtkv.measures.stats import separated

    base = rows[0].get("bench", {})
    words = ["(baseline)"]
    for r in rows[1:]:
        b = r.get("bench", {})
        apart = separated(base.get(f"{key}.ci"), b.get(f"{key}.ci"))
        if apart is None:
            words.append("no interval")
        elif not apart:
            words.append("within noise")
        else:
            words.append("higher" if b[key] > base[key] else "lower")
    return " | ".join(words)


def write_compare(
    recipes: list[Recipe], plans: list[PlanFigures], results: list[ChainResult], out: Path
) -> Path:
    """engines/compare/compare.md + compare.json + compare.png: the KV formats side by side (each
    recipe with its plan, trtkv.plan.figures)."""
    rows = [collect(r, p) for r, p in zip(recipes, plans, strict=True)]
    out.mkdir(parents=True, exist_ok=True)
    keys = [
        "quiz.accuracy",
        "golden.agreement",
        "needle.accuracy",
        *(["ruler.accuracy"] if any("ruler.accuracy" in r.get("bench", {}) for r in rows) else []),
        "time_to_first_token.p50",
        "time_to_first_token.p99",
        "inter_token_latency.p50",
        "inter_token_latency.p99",
        "output_token_throughput.max",
    ]
    head = "| | " + " | ".join(r["recipe"] for r in rows) + " |"
    md = [
        "# KV-cache formats side by side",
        "",
        "Measured by `trtkv compare` on this machine; accuracy and latency come from each recipe's "
        "`engines/<recipe>/bench/results.json`, bytes and capacity from the planner. An accuracy "
        "difference is called (higher/lower) only where the two 95% intervals do not overlap; "
        "otherwise it is within noise.",
        "",
        head,
        "|" + "---|" * (len(rows) + 1),
        _row("KV cache", (f"{r['kv_cache']} ({r['kv_format']})" for r in rows)),
        _row("KV bytes/token", (f"{r['kv_bytes_per_token']:,.0f}" for r in rows)),
        _row("tokens that fit (planner)", (f"{r['planner']['tokens_fit']:,}" for r in rows)),
    ]
    for key in keys:
        if key.split(".")[0] in ACCURACY_TASKS:
            md.append(
                _row(f"{key} (95% interval)", (with_ci(r.get("bench", {}), key) for r in rows))
            )
            if len(rows) > 1:
                md.append(_row(f"{key} vs {rows[0]['recipe']}", [accuracy_difference(rows, key)]))
        else:
            md.append(_row(key, (figure(r.get("bench", {}).get(key), 1) for r in rows)))
    md.append(_row("chain", ("ok" if not r.failed else f"failed at {r.failed}" for r in results)))
    # each recipe's own KV format
    probes = [(r["recipe"], p) for r in rows for p in r.get("probe", [])]
    if probes:
        md += [
            "",
            "## Probe excerpt",
            "",
            "| recipe | format | context | KL mean | top-1 agreement | needle |",
            "|---|---|---|---|---|---|",
        ]
        md += [
            f"| {name} | {p['format']} | {p['context_len']} | {figure(p.get('kl_mean'), 4)} | "
            f"{figure(p.get('top1_agreement'), 3)} | {figure(p.get('needle_accuracy'), 2)} |"
            for name, p in probes
        ]
    md += _sweep_section(rows, out)
    md += prefix_section(rows)
    (out / "compare.md").write_text("\n".join(md) + "\n")
    (out / "compare.json").write_text(json.dumps(rows, indent=2, default=str) + "\n")
    _compare_plot(rows, out / "compare.png")
    return out / "compare.md"


def prefix_section(rows: list[dict[str, Any]]) -> list[str]:
    """bench.prefix's hit rates per tier and TTFT per turn, per recipe and level, side by side (a
    quantized cache keeps more blocks in the same pool: a higher hit rate at the same workload),
    each against the plan's prediction with the routing it assumes."""
    lines = [
        f"| {r['recipe']} | {label} | "
        + ", ".join(f"{t} {figure(v, 3)}" for t, v in body["hit_rate"].items())
        + " | "
        + ", ".join(f"turn {t}: {figure(v, 1)}" for t, v in body["ttft_ms_p50_per_turn"].items())
        + f" | {body.get('against_plan') or '-'} |"
        for r in rows
        for label, body in (r.get("prefix") or {}).items()
    ]
    if not lines:
        return []
    head = (
        "| recipe | level | hit rate per tier (server) | TTFT p50 ms per turn | server against "
        "plan (difference), routing assumed |"
    )
    return ["", "## Prefix reuse (bench.prefix)", "", head, "|---|---|---|---|---|", *lines]


def sweep_breakeven(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each recipe's input sweep against the first's, per level both ran: the fits and the
    break-even length."""
    from trtkv.measures.sweep import break_even

    base = rows[0].get("sweep") or {}
    out = []
    for r in rows[1:]:
        other = r.get("sweep") or {}
        for level, body in (base.get("levels") or {}).items():
            if level in (other.get("levels") or {}):
                out.append(
                    {
                        "base": rows[0]["recipe"],
                        "other": r["recipe"],
                        "level": level,
                        **break_even(body, other["levels"][level]),
                    }
                )
    return out


def _sweep_section(rows: list[dict[str, Any]], out: Path) -> list[str]:
    """compare.md's input-sweep part (ITL slope/intercept per recipe, break-even vs the first) and
    its plot."""
    from trtkv.contracts.bench_doc import SweepLevel
    from trtkv.measures.plots import itl_vs_input
    from trtkv.measures.sweep import break_even_text

    swept = [r for r in rows if r.get("sweep")]
    if not swept:
        return []
    md = [
        "",
        "## ITL against input length (`bench --sweep-input`)",
        "",
        "| recipe | level | input tokens | ITL p50 (ms) | ITL slope (ms/token) | ITL intercept "
        "(ms) | TTFT slope (ms/token) |",
        "|---|---|---|---|---|---|---|",
    ]
    series = {}
    for r in swept:
        for level, body in r["sweep"]["levels"].items():
            fit, tfit = body.get("itl_fit") or {}, body.get("ttft_fit") or {}
            md.append(
                f"| {r['recipe']} | {level} | "
                f"{', '.join(f'{x:,.0f}' for x in body['input_tokens'])} | "
                f"{', '.join(f'{y:.2f}' for y in body['itl_p50_ms'])} | {_g(fit.get('slope'))} | "
                f"{_g(fit.get('intercept'))} | {_g(tfit.get('slope'))} |"
            )
            series[f"{r['recipe']} {level}"] = SweepLevel.model_validate(body)
    verdicts = sweep_breakeven(rows)
    for v in verdicts:
        md.append("")
        md.append(f"- {v['level']}: " + break_even_text(v["base"], v["other"], v))
    rows[0]["sweep_break_even"] = verdicts
    if itl_vs_input(out / "compare_itl_vs_input.png", series, "ITL vs input length, per recipe"):
        md += ["", "![ITL vs input length](compare_itl_vs_input.png)"]
    return md


# the accuracy figures the plot draws, each where some recipe's bench has it (RULER where one ran)
PLOT_ACCURACY = ("quiz.accuracy", "golden.agreement", "needle.accuracy", "ruler.accuracy")


def plot_values(rows: list[dict[str, Any]], keys: Iterable[str]) -> dict[str, list[float]]:
    """Each key some row's bench has, one value per row: NaN (no bar) where that row's bench lacks
    it, never a 0 that reads as measured."""
    bench = [r.get("bench", {}) for r in rows]
    return {
        k: [float("nan") if b.get(k) is None else float(b[k]) for b in bench]
        for k in keys
        if any(b.get(k) is not None for b in bench)
    }


def _compare_plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["recipe"] for r in rows]
    panels = [
        ("accuracy", plot_values(rows, PLOT_ACCURACY)),
        ("latency (ms)", plot_values(rows, ["time_to_first_token.p50", "inter_token_latency.p50"])),
        ("KV bytes/token", None),
    ]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, (title, keys) in zip(axes, panels, strict=True):
        if keys is None:
            ax.bar(names, [r["kv_bytes_per_token"] for r in rows], color="tab:gray")
        elif keys:
            width = 0.8 / len(keys)
            for i, (key, vals) in enumerate(keys.items()):
                ax.bar([j + i * width for j in range(len(rows))], vals, width, label=key)
            ax.set_xticks([j + width * (len(keys) - 1) / 2 for j in range(len(rows))], names)
            ax.legend(fontsize=7)
        ax.set_title(title)
        ax.tick_params(axis="x", labelrotation=15, labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _row(label: str, cells: Iterable[str]) -> str:
    return f"| {label} | " + " | ".join(cells) + " |"


def _g(value: float | None) -> str:
    return "—" if value is None else f"{value:.3g}"
