"""Reports: one recipe's summary (JSON/Markdown) and what it is read from, `collect` (the
side-by-side comparison of several recipes, which reads each through `collect`, is
trtkv.report.compare).

Every figure is read from the stage outputs on disk (calibration, bench, probe) or from the plan's
figures the CLI hands in (trtkv.contracts.PlanFigures); nothing here is typed in.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from trtkv.contracts import BenchResults, BenchSweep, KVScalesFile, Manifest, MetricStats
from trtkv.core import paths
from trtkv.core.errors import StageError
from trtkv.recipe import layout

if TYPE_CHECKING:
    from trtkv.contracts.plan_figures import PlanFigures
    from trtkv.recipe import Recipe
    from trtkv.report.chain import ChainResult

T = TypeVar("T")
LATENCY_METRICS = ("time_to_first_token", "inter_token_latency", "request_latency")


def _tolerant(load: Callable[[Path], T | None], folder: Path) -> T | None:
    """A stage file through its typed model; an unreadable one is left out of the report (as a
    missing one is)."""
    try:
        return load(folder)
    except StageError:
        return None


def bench_headline(results: BenchResults) -> dict[str, Any]:
    """Latency stats at the lowest concurrency, best throughput over the sweep, and accuracy per
    task, from `trtkv bench`'s results.json (its levels map "concurrency=N" or "rate=R" to
    GenAI-Perf metrics)."""
    levels = results.levels
    out: dict[str, Any] = {}
    if levels:

        def order(name: str) -> float:
            try:
                return float(name.split("=", 1)[1])
            except (IndexError, ValueError):
                return float("inf")

        first = min(levels, key=order)
        out["level"] = first
        for metric in LATENCY_METRICS:
            stats = getattr(levels[first], metric) or MetricStats()
            for stat in ("p50", "p99"):
                if getattr(stats, stat) is not None:
                    out[f"{metric}.{stat}"] = getattr(stats, stat)
        for metric in ("output_token_throughput", "request_throughput"):
            values = [m.avg for lv in levels.values() if (m := getattr(lv, metric)) is not None]
            values = [v for v in values if v is not None]
            if values:
                out[f"{metric}.max"] = max(values)
        out["requests.failed"] = sum(lv.request_count.get("failed", 0) for lv in levels.values())
    for task, body in results.accuracy.items():
        for key in ("accuracy", "agreement"):  # the task's score and its interval, by field
            value, ci = getattr(body, key), getattr(body, f"{key}_ci")
            if value is not None:
                out[f"{task}.{key}"] = value
                if ci is not None and len(ci) == 2 and None not in ci:  # null ends: none measured
                    out[f"{task}.{key}.ci"] = ci
    return out


ACCURACY_TASKS = ("quiz", "golden", "needle", "ruler")


def with_ci(b: dict[str, Any], key: str) -> str:
    """A figure and its stored interval, e.g. "0.350 [0.206, 0.526]"."""
    from trtkv.measures.stats import interval_text

    text = figure(b.get(key), 3)
    ci = b.get(f"{key}.ci")
    return f"{text} {interval_text(ci)}" if ci is not None and b.get(key) is not None else text


def collect(recipe: Recipe, planned: PlanFigures) -> dict[str, Any]:
    """Everything known about one recipe's run, from disk and its plan (trtkv.plan.figures)."""
    data: dict[str, Any] = {
        "recipe": recipe.name,
        "description": recipe.description,
        "kv_cache": recipe.quantization.kv_cache.value,
        "weights": recipe.quantization.weights.value,
    }
    fmt = planned.kv_format
    cap = planned.formats[fmt]
    data["kv_format"] = fmt
    data["kv_bytes_per_token"] = cap.bytes_per_token
    data["planner"] = {
        "hardware": planned.gpu,
        "memory_gib": planned.memory_gib,
        "kv_budget_gib": planned.pool_gib_per_gpu,
        "tokens_fit": cap.tokens_per_gpu,
        "max_seq_len": recipe.build.max_seq_len,
        "sequences_at_max_seq_len": cap.sequences_at_max_seq_len,
    }
    scales = _tolerant(KVScalesFile.load, layout.checkpoint_dir(recipe))
    if scales:
        layers = scales.layers
        data["calibration"] = {
            "layers": len(layers),
            "kv_cache_quant_algo": scales.kv_cache_quant_algo,
            "max_k_amax": max((x.k_amax for x in layers), default=None),
            "max_v_amax": max((x.v_amax for x in layers), default=None),
        }
    stages = {}
    folders = {
        layout.CHECKPOINT: layout.checkpoint_dir(recipe),
        layout.ENGINE: layout.engine_dir(recipe),
        layout.SERVE: layout.serve_dir(recipe),
        layout.BENCH: layout.bench_dir(recipe),
        layout.PROBE: layout.probe_dir(recipe),
        "triton_repo": paths.triton_repo_dir() / recipe.name,
    }
    for stage, folder in folders.items():
        manifest = _tolerant(Manifest.load, folder)
        if manifest:
            stages[stage] = {"path": str(folder), "wall_seconds": manifest.wall_seconds}
    data["stages"] = stages
    # a results.json of another shape is left out, as an unreadable one
    results = _tolerant(BenchResults.load, layout.bench_dir(recipe))
    if results and "bench" in stages and results.wall_seconds is not None:
        # the measurement, not just the write
        stages["bench"]["wall_seconds"] = results.wall_seconds
    if results:
        data["bench"] = bench_headline(results)
        data["bench_passed"] = results.slo.passed if results.slo else None
        sweep = _shaped(_checked_sweep, results.sweep) if results.sweep else None
        if sweep:
            data["sweep"] = sweep
        if results.prefix:  # bench.prefix: the server's hit rate per tier, TTFT per turn
            data["prefix"] = {
                label: {
                    "hit_rate": {t: x.hit_rate for t, x in level.tiers.items()},
                    "ttft_ms_p50_per_turn": level.ttft_ms_p50_per_turn,
                    "source": level.source,
                    # the plan's rates beside the server's (PlanFigures.prefix, via bench)
                    "predicted": (
                        level.predicted.model_dump() if level.predicted is not None else None
                    ),
                    "against_plan": level.against_plan_text(),
                }
                for label, level in results.prefix.items()
            }
    # this recipe's probe, else another recipe's on the same model
    from trtkv.measures.probe_results import load_probe

    probe = _shaped(load_probe, recipe)
    if probe:  # the recipe's format at the shortest and longest probed lengths, as written
        lengths = [r.context_len for r in probe.records]
        ends = (min(lengths), max(lengths))
        rows = [r for r in probe.records if r.format == fmt and r.context_len in ends]
        if rows:
            data["probe"] = [r.model_dump(exclude_unset=True) for r in rows]
            data["probe_source"] = probe.recipe
    return data


def _checked_sweep(sweep: BenchSweep) -> dict[str, Any]:
    """results.json's `sweep` with its medians and fits recomputed from its samples alone
    (trtkv.measures.sweep.fits): a hand-edited file cannot hand compare a fit they do not give."""
    from trtkv.measures.sweep import fits

    levels: dict[str, Any] = {}
    for label, body in sweep.levels.items():
        samples = {n: got.model_dump() for n, got in body.samples.items()}
        levels[label] = {"samples": samples, **fits({int(n): v for n, v in samples.items()})}
    return {
        "input_tokens": sorted({int(n) for body in levels.values() for n in body["samples"]}),
        "levels": levels,
    }


def _shaped(read: Callable[..., T], *args: Any) -> T | None:
    """`read(*args)`, or None when the file it reads has another shape than trtkv writes (a mistyped
    or hand-edited results.json or probe.json): the report leaves it out, as it leaves out an
    unreadable file."""
    try:
        return read(*args)
    except (TypeError, ValueError, KeyError, AttributeError, IndexError, StageError):
        return None


def figure(value: Any, digits: int = 1) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        if 0 < abs(value) < 1 and digits <= 3:
            return f"{value:.3f}"
        return f"{value:,.{digits}f}"
    return str(value)


def summary_lines(data: dict[str, Any]) -> list[str]:
    b = data.get("bench", {})
    planner = data["planner"]
    lines = [
        f"Summary for {data['recipe']}: weights {data['weights']}, KV cache {data['kv_cache']} "
        f"({data['kv_format']}, {data['kv_bytes_per_token']:,.0f} bytes/token)"
    ]
    acc = [
        f"{k} {with_ci(b, k)}"
        for k in b
        if k.split(".")[0] in ACCURACY_TASKS and not k.endswith(".ci")
    ]
    lines += _wrapped("  accuracy:   ", acc or ["no bench results"])
    if "time_to_first_token.p50" in b:
        lines.append(
            f"  latency @{b.get('level')}: TTFT p50 {figure(b['time_to_first_token.p50'])} ms, "
            f"p99 {figure(b.get('time_to_first_token.p99'))} ms; ITL p50 "
            f"{figure(b.get('inter_token_latency.p50'))} ms, p99 "
            f"{figure(b.get('inter_token_latency.p99'))} ms"
        )
        lines.append(
            f"  throughput: {figure(b.get('output_token_throughput.max'))} output tokens/s, "
            f"{figure(b.get('request_throughput.max'), 2)} requests/s (best over the concurrency "
            "sweep)"
        )
    lines.append(
        f"  planner:    {planner['hardware']} with {figure(planner['memory_gib'])} GiB: KV budget "
        f"{figure(planner['kv_budget_gib'])} GiB = {planner['tokens_fit']:,} tokens of "
        f"{data['kv_format']} KV, {planner['sequences_at_max_seq_len']:,} sequences of "
        f"{planner['max_seq_len']:,} tokens"
    )
    for stage, info in data.get("stages", {}).items():
        lines.append(f"  {stage + ':':<12}{info['path']}  ({figure(info.get('wall_seconds'))} s)")
    return lines


def write_report(recipe: Recipe, planned: PlanFigures, out: Path | None = None) -> Path:
    """engines/<recipe>/report/{report.json, report.md, manifest.json}."""
    started = time.time()
    data = collect(recipe, planned)
    out = out or layout.report_dir(recipe)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(data, indent=2, default=str) + "\n")
    md = [
        f"# trtkv report: {recipe.name}",
        "",
        recipe.description,
        "",
        "```",
        *summary_lines(data),
        "```",
        "",
    ]
    if data.get("probe"):
        md += [
            "## Probe excerpt (this KV format vs the unquantized baseline)",
            "",
            "| format | context | KL mean | top-1 agreement | ppl delta | needle |",
            "|---|---|---|---|---|---|",
        ]
        for r in data["probe"]:
            md.append(
                f"| {r['format']} | {r['context_len']} | {figure(r.get('kl_mean'), 4)} | "
                f"{figure(r.get('top1_agreement'), 3)} | {figure(r.get('ppl_delta'), 3)} | "
                f"{figure(r.get('needle_accuracy'), 2)} |"
            )
    if data.get("prefix"):
        md += [
            "",
            "## Prefix reuse (bench.prefix): hit rate per tier, the server's against the plan's",
            "",
        ]
        md += [f"- {label}: {body['against_plan']}" for label, body in data["prefix"].items()]
    (out / "report.md").write_text("\n".join(md) + "\n")
    Manifest(
        stage="report",
        recipe=recipe.name,
        key=None,
        wall_seconds=round(time.time() - started, 3),
        inputs=sorted(data.get("stages", {})),
    ).save(out)
    return out


def print_summary(recipe: Recipe, planned: PlanFigures, result: ChainResult | None = None) -> None:
    data = collect(recipe, planned)
    print()
    if result is not None:
        print(chain_line(result))
    print("\n".join(summary_lines(data)))


def chain_line(result: ChainResult) -> str:
    """The demo's first summary line: each step's seconds and the total."""
    steps = ", ".join(
        f"{s.verb} {s.seconds:.0f}s" + ("" if s.returncode == 0 else f" (exit {s.returncode})")
        for s in result.steps
    )
    return f"Chain for {result.recipe}: {steps}; total {result.seconds:.0f} s"


SUMMARY_WIDTH = 110  # a summary line's width before its figures continue on the next line


def _wrapped(head: str, items: list[str]) -> list[str]:
    """`head` and the items joined by ", ", continued under the first item where a line would pass
    SUMMARY_WIDTH (a terminal's summary, the README's copy of it)."""
    lines = [head + items[0]]
    for item in items[1:]:
        if len(lines[-1]) + 2 + len(item) > SUMMARY_WIDTH:
            lines[-1] += ","
            lines.append(" " * len(head) + item)
        else:
            lines[-1] += ", " + item
    return lines
