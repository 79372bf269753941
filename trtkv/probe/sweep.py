"""The driver: run (or resume) the sweep, each (format, length) read from or written to its cache
(trtkv.probe.sweep_cache), and write probe.json/probe.md/plots."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from trtkv.core.progress import Progress
from trtkv.kvcache.attention_modes import CACHE_ONLY, load_attention
from trtkv.kvcache.names import FormatChoice, parse_format
from trtkv.kvcache.scales import KVScales
from trtkv.probe.attention import applies, record_fields
from trtkv.probe.measure import probe_scales, reference_hidden, run_format
from trtkv.probe.metrics import finish_runs, head_positions, length_record, scale_reuse_summary
from trtkv.probe.setup import METHOD_VERSION, Loaded, ProbeSettings, default_settings, load_model
from trtkv.probe.sweep_cache import (
    cached_records,
    decode_cached,
    drift_cached,
    format_key,
    job_tag,
    load_run,
    needle_cached,
    pass_needles_cached,
    save_pass_needles,
    save_run,
    scales_key,
)
from trtkv.version import __version__ as trtkv_version

if TYPE_CHECKING:
    from trtkv.recipe import Recipe


# ----------------------------------------------------------------------------- driver


class _Progress:
    """The probe's work items on one progress bar (trtkv.core.progress), or nothing."""

    def __init__(self, enabled: bool, total: int):
        self._progress = Progress(enabled, label="[bold]probe[/] {task.description}").__enter__()
        self._task = self._progress.task("starting", total)

    def step(self, text: str, advance: int = 0) -> None:
        self._task.advance(advance, description=text)

    def close(self) -> None:
        self._progress.__exit__()


def probe_output(recipe: Recipe, output: Path | None) -> Path:
    """The probe's folder, created: it writes its cache and results in place, so a user's --output
    must be new, empty or an earlier probe of this recipe."""
    from trtkv.contracts.outputs import in_place_output
    from trtkv.recipe.layout import probe_dir

    return in_place_output(
        Path(output) if output is not None else None, probe_dir(recipe), "probe", recipe.name
    )


def run_probe(
    recipe: Recipe, output: Path | None = None, settings: ProbeSettings | None = None
) -> Path:
    """Run (or resume) the sweep and write probe.json, probe.md and plots into `output`."""
    from trtkv.probe.outputs import write_outputs

    settings = settings or default_settings(recipe)
    out = probe_output(recipe, output)
    started = time.time()
    choices = [parse_format(f) for f in settings.formats]
    static = [c for c in choices if c.static]
    needled = [
        c for c in choices if settings.needle_formats is None or c.name in settings.needle_formats
    ]
    table = load_attention()
    engine = [
        (c, m)
        for m in settings.attention
        if m != CACHE_ONLY
        for c in choices[1:]
        if applies(table.mode(m), c)
    ]
    jobs = [(c, CACHE_ONLY) for c in choices] + engine
    work = (
        len(jobs)
        + len(needled) * len(settings.needle_lengths)
        + (1 if static else 0)
        + 2
        + len(engine)
    )
    work += len(choices) if settings.ruler is not None else 0
    bar = _Progress(settings.progress, work)
    try:
        bar.step("loading the model")
        loaded = load_model(recipe, settings)
        bar.step("calibrating static scales (short prompts)", 1)
        scales = probe_scales(recipe, loaded, settings, out)
        skey = partial(scales_key, scales)  # per format: what it reads of the scales
        n = max(settings.lengths)
        ref_hidden: torch.Tensor | None = None
        ref_bytes: dict = {}
        by_job: dict[str, list[dict]] = {}
        runs, timings = {}, {}
        bar.step(f"reference pass ({loaded.reference} KV)", 1)
        # needles asked from the KL passes (a windowed model's)
        shared: dict[tuple[str, int], dict] = {}
        for choice, mode in jobs:
            tag, key = job_tag(choice, mode), format_key(loaded.key, choice, mode)
            cached = cached_records(out, key, skey(choice), choice, settings.lengths, tag)
            if cached is not None and loaded.needles is not None and mode == CACHE_ONLY:
                found = pass_needles_cached(
                    out, loaded, choice, skey(choice), settings.needle_lengths
                )
                # measured before the needles: the pass runs again
                cached = cached if found is not None else None
                shared.update({(choice.name, n): r for n, r in (found or {}).items()})
            if cached is not None:
                by_job[tag] = cached
                bar.step(f"{tag}: cached", 1)
                continue
            # a windowed model: the reference's hidden states at the LM head's rows only
            if ref_hidden is None:
                ref_hidden, ref_bytes = reference_hidden(
                    loaded, n, out, head_positions(loaded, n - 1)
                )
            bar.step(f"{tag}: {n}-token pass")
            run = runs[tag] = run_format(
                loaded, choice, scales, n, ref_hidden, defer_head=True, mode=mode
            )
            timings[tag] = run["seconds"]
            timings[f"{tag}_cpu"] = run["cpu_seconds"] or ref_bytes.get("cpu_seconds", 0.0)
            found = run.get("needles") or (
                ref_bytes.get("needles") if choice.name == loaded.reference else None
            )
            if loaded.needles is not None and found and mode == CACHE_ONLY:
                save_pass_needles(out, loaded, choice, skey(choice), found)
                shared.update({(choice.name, n): r for n, r in found.items()})
                timings[f"{choice.name}_needles_cpu"] = next(iter(found.values()))["cpu_seconds"]
        # every pending format's LM head with ONE reference head pass
        if runs and ref_hidden is not None:
            bar.step(f"LM head: {', '.join(runs)}")
            started_head, cpu_head = time.time(), time.process_time()
            finish_runs(loaded, runs, ref_hidden, n)
            timings["lm_head"] = round(time.time() - started_head, 1)
            timings["lm_head_cpu"] = round(time.process_time() - cpu_head, 1)
        for choice, mode in jobs:
            tag = job_tag(choice, mode)
            if tag in runs:
                run = runs[tag]
                recs = [
                    {**length_record(loaded, choice, run, length, ref_bytes), **record_fields(mode)}
                    for length in settings.lengths
                ]
                save_run(
                    out, format_key(loaded.key, choice, mode), skey(choice), choice, run, recs, tag
                )
                by_job[tag] = recs
                bar.step(f"{tag}: done", 1)
        records = [
            {**rec, **record_fields(CACHE_ONLY)}
            for choice in choices
            for rec in by_job[choice.name]
        ]
        attention_records = [
            rec for choice, mode in engine for rec in by_job[job_tag(choice, mode)]
        ]
        needles = {}
        for choice in needled:
            if loaded.needles is not None:  # asked from the format's KL pass (trtkv.probe.needles)
                needles.update({k: v for k, v in shared.items() if k[0] == choice.name})
                bar.step(f"needles {choice.name}: from the KL pass", len(settings.needle_lengths))
                continue
            for length in settings.needle_lengths:
                bar.step(f"needle {choice.name} @ {length}")
                needles[(choice.name, length)] = needle_cached(
                    out, loaded, choice, scales, skey(choice), length, settings
                )
                bar.step(f"needle {choice.name} @ {length}: done", 1)
        _attach_needles(records, needles, settings)
        ruler_doc = (
            _ruler(out, recipe, loaded, choices, scales, skey, settings, bar)
            if settings.ruler is not None
            else None
        )
        decode = {}
        if static:
            bar.step("scale reuse through decode steps")
            decode = decode_cached(out, loaded, static, scales, skey(*static), settings)
            bar.step("scale reuse: done", 1)
        drifts = []
        for choice, mode in engine:
            bar.step(f"prefill vs decode: {job_tag(choice, mode)}")
            drifts.append(drift_cached(out, loaded, choice, mode, scales, skey(choice), settings))
            bar.step(f"prefill vs decode: {job_tag(choice, mode)} done", 1)
        runs_for_reuse = {
            c.name: runs.get(c.name) or load_run(out, format_key(loaded.key, c), skey(c), c)
            for c in static
        }
        reuse = scale_reuse_summary(
            scales, {k: v for k, v in runs_for_reuse.items() if v}, settings.lengths
        )
        reuse["decode"] = decode
        curves = {
            c.name: _kl_curve(
                runs.get(c.name) or load_run(out, format_key(loaded.key, c), skey(c), c)
            )
            for c in choices
        }
        bar.step("writing report", 1)
        doc = _document(recipe, loaded, settings, scales, records, needles, reuse, timings, started)
        doc.update(
            attention_records=attention_records,
            drift=drifts,
            attention={"modes": settings.attention, "reasons": settings.attention_reasons},
        )
        if ruler_doc is not None:
            doc["ruler"] = ruler_doc
        write_outputs(out, doc, scales.stats.to_markdown() if scales.stats else None, curves)
    finally:
        bar.close()
    return out


def _kl_curve(run: dict | None, window: int = 256) -> list[float] | None:
    """KL averaged over consecutive windows of positions (error vs position; sampled positions:
    those in each)."""
    if not run:
        return None
    kl = run["metrics"]["kl"].double()
    pos = run["metrics"].get("pos")
    if pos is None:
        return [float(kl[i : i + window].mean()) for i in range(0, kl.numel(), window)]
    # at least one sample per window
    span = max(window, int(pos[1] - pos[0]) if pos.numel() > 1 else window)
    return [
        float(kl[(pos >= i) & (pos < i + span)].mean()) for i in range(0, int(pos[-1]) + 1, span)
    ]


def _ruler(
    out: Path,
    recipe: Recipe,
    loaded: Loaded,
    choices: list[FormatChoice],
    scales: KVScales,
    skey: Callable[[FormatChoice], str],
    settings: ProbeSettings,
    bar: _Progress,
) -> dict:
    """RULER on the bench's items for every format (trtkv.probe.ruler), answers cached per format
    and item."""
    from trtkv.probe.ruler import run_ruler

    def keys(choice: FormatChoice) -> list[str]:
        return [format_key(loaded.key, choice), skey(choice) if choice.static else ""]

    return run_ruler(
        out,
        settings.ruler,
        loaded,
        choices,
        scales,
        keys,
        recipe.model.max_position_embeddings,
        bar.step,
    )


def _attach_needles(records: list[dict], needles: dict, settings: ProbeSettings) -> None:
    for rec in records:
        res = needles.get((rec["format"], rec["context_len"]))
        if res:
            rec["needle_accuracy"] = res["accuracy"]
            rec["needle_by_depth"] = res["by_depth"]
            rec["needle_seeds"] = settings.needle_seeds


def _document(
    recipe: Recipe,
    loaded: Loaded,
    settings: ProbeSettings,
    scales: KVScales,
    records: list[dict],
    needles: dict,
    reuse: dict,
    timings: dict,
    started: float,
) -> dict:
    import transformers

    needle_rows = [
        {"format": f, "context_len": n, **{k: v for k, v in r.items() if k != "trials"}}
        for (f, n), r in needles.items()
    ]
    return {
        "recipe": recipe.name,
        "model": {"source": recipe.model.source, **loaded.info},
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "seconds": round(time.time() - started, 1),
        "versions": {
            "trtkv": trtkv_version,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
        "settings": {
            "formats": settings.formats,
            "lengths": settings.lengths,
            "needle_lengths": settings.needle_lengths,
            "needle_depths": settings.needle_depths,
            "needle_seeds": settings.needle_seeds,
            "needle_method": "shared_haystack"
            if loaded.needles is not None
            else "one_needle_per_trial",
            "decode_prompt": settings.decode_prompt,
            "decode_steps": settings.decode_steps,
            "attention": settings.attention,
            "dtype": loaded.info.get("compute_dtype"),
            "prefill_chunk": loaded.prefill_chunk,
            **(
                {
                    "ruler_tasks": settings.ruler.tasks,
                    "ruler_lengths": settings.ruler.lengths,
                    "ruler_samples": settings.ruler.samples,
                }
                if settings.ruler is not None
                else {}
            ),
        },
        "reference": loaded.reference,
        "method_version": METHOD_VERSION,
        "scales": scales.to_probe_json(),
        "records": records,
        "needles": needle_rows,
        "scale_reuse": reuse,
        "pass_seconds": timings,
        "kv_stats": scales.stats.to_dict() if scales.stats else None,
        "threads": torch.get_num_threads(),  # the count used: setup set it (--threads, else auto)
    }
