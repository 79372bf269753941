"""RULER in trtkv: items at given lengths, RULER's string_match_all per length and task with a
Wilson interval, and the `ruler` task of `trtkv bench`. The probe (trtkv.probe.ruler) scores the
same items: `generate_items` with `encoder(tokenizer)`, then `summarize`.

Scoring as RULER's scripts/eval/evaluate.py (postprocess_pred) and
scripts/eval/synthetic/constants.py (string_match_all, the metric of all six tasks) at NVIDIA/RULER
c3f5e3b4f87f97e048793bb510a3a6b19a46bf3a.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from trtkv.bench.tasks.ruler_families import FAMILIES, Encode, RulerError
from trtkv.bench.tasks.ruler_gen import RULER_COMMIT, RULER_SEED, TASKS, RulerItem, generate
from trtkv.core.errors import TrtkvError
from trtkv.measures.stats import CONFIDENCE, wilson_interval

TASK_NAMES = tuple(TASKS)
if TYPE_CHECKING:
    from trtkv.bench.tasks.accuracy import Task
    from trtkv.contracts import RequestRecord, RulerPlan
    from trtkv.recipe import Recipe

_CONTROL = re.compile(r"[\x00-\x1f]")

__all__ = [
    "CONFIDENCE",
    "RULER_COMMIT",
    "RULER_SEED",
    "TASK_NAMES",
    "RulerError",
    "RulerItem",
    "encoder",
    "generate",
    "generate_items",
    "max_tokens",
    "postprocess",
    "ruler_score",
    "ruler_task",
    "special_tokens",
    "probe_plan",
    "string_match_all",
    "summarize",
]


def encoder(tokenizer: Any) -> Encode:
    """The encode RULER fits items with: the tokenizer without special tokens (RULER counts with HF
    tokenize())."""
    return lambda text: list(tokenizer.encode(text, add_special_tokens=False))


def special_tokens(tokenizer: Any) -> int:
    """Special tokens the server's preprocessing adds to every prompt (0 or a BOS): the bench's and
    probe's margin."""
    return len(tokenizer.encode("", add_special_tokens=True))


def max_tokens(task: str) -> int:
    """RULER's tokens_to_generate for a task (niah 128, vt 30, cwe 120, fwe 50)."""
    return FAMILIES[TASKS[task][0]][2]


def generate_items(
    encode: Encode,
    lengths: Sequence[int],
    samples: int,
    tasks: Sequence[str] = TASK_NAMES,
    seed: int = RULER_SEED,
    refuse: Callable[[int, int], str | None] = lambda length, tokens: None,
) -> tuple[list[RulerItem], list[str]]:
    """`samples` items per (length, task); a pair that cannot be made, or that `refuse(length,
    max_tokens)` gives a reason against (e.g. longer than the server takes), is a note instead,
    never silently dropped."""
    items: list[RulerItem] = []
    notes: list[str] = []
    for length in lengths:
        for task in tasks:
            reason = refuse(length, max_tokens(task))
            if reason:
                notes.append(f"{task} @ {length} not run: {reason}")
                continue
            try:
                items += generate(task, length, samples, encode, seed)
            except TrtkvError as exc:  # RulerError (too short), ToolError (wonderwords missing)
                notes.append(f"{task} @ {length} not run: {exc}")
    return items, notes


def postprocess(prediction: str) -> str:
    """RULER's postprocess_pred: strip, control characters to newlines, strip again."""
    return _CONTROL.sub("\n", prediction.strip()).strip()


def string_match_all(prediction: str, references: Sequence[str]) -> float:
    """One item's score: the fraction of references found, case-insensitively, in the prediction."""
    pred = postprocess(prediction).lower()
    return sum(1.0 for r in references if r.lower() in pred) / len(references)


def ruler_score(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """RULER's figure: string_match_all averaged over the items, in percent, rounded to 2
    decimals."""
    scores = [string_match_all(p, r) for p, r in zip(predictions, references, strict=True)]
    return round(sum(scores) / len(scores) * 100, 2)


def _cell(rows: list[dict[str, Any]], confidence: float) -> dict[str, Any]:
    n = len(rows)
    total = sum(r["score"] for r in rows)
    lo, hi = wilson_interval(total, n, confidence)
    tokens = [r["input_tokens"] + r["max_tokens"] for r in rows]
    return {
        "score": round(total / n * 100, 2),
        "mean": total / n,
        "interval": [lo, hi],
        "n": n,
        "all_found": sum(r["score"] == 1.0 for r in rows),
        "failed": sum(not r["ok"] for r in rows),
        "tokens": {"min": min(tokens), "mean": sum(tokens) / n, "max": max(tokens)},
    }


def summarize(
    items: Sequence[RulerItem],
    predictions: Sequence[str],
    ok: Sequence[bool] | None = None,
    confidence: float = CONFIDENCE,
) -> dict[str, Any]:
    """Per length and task: RULER's score (percent), the mean with its Wilson interval, all-found
    and failed counts; per length RULER's average over the tasks; overall the mean over items
    (`accuracy`, `accuracy_ci` as every task). A failed answer scores 0."""
    oks = list(ok) if ok is not None else [True] * len(items)
    rows: list[dict[str, Any]] = []
    for item, pred, good in zip(items, predictions, oks, strict=True):
        score = string_match_all(pred, item.outputs) if good else 0.0
        rows.append(
            {
                "task": item.task,
                "length": item.length,
                "index": item.index,
                "input_tokens": item.input_tokens,
                "max_tokens": item.max_tokens,
                "outputs": item.outputs,
                "prediction": pred,
                "ok": good,
                "score": score,
            }
        )
    by_length: dict[str, dict[str, Any]] = {}
    for length in sorted({r["length"] for r in rows}):
        cells = {
            task: _cell(
                [r for r in rows if r["length"] == length and r["task"] == task], confidence
            )
            for task in TASK_NAMES
            if any(r["length"] == length and r["task"] == task for r in rows)
        }
        by_length[str(length)] = {
            "average": round(sum(c["score"] for c in cells.values()) / len(cells), 2),
            "tasks": cells,
        }
    n = len(rows)
    total = sum(r["score"] for r in rows)
    lo, hi = wilson_interval(total, n, confidence)
    return {
        "accuracy": total / n if n else 0.0,
        "accuracy_ci": [lo, hi],
        "confidence": confidence,
        "correct": sum(r["score"] == 1.0 for r in rows),
        "total": n,
        "failed": sum(not r["ok"] for r in rows),
        "metric": "string_match_all",
        "ruler_commit": RULER_COMMIT,
        "by_length": by_length,
        "items": rows,
    }


def table_lines(summary: dict[str, Any]) -> list[str]:
    """One line per length and task: RULER's score and the interval, for results.md's notes."""
    lines = []
    for length, block in summary["by_length"].items():
        for task, c in block["tasks"].items():
            lo, hi = c["interval"]
            lines.append(
                f"{task} @ {length}: {c['score']:.2f} (mean {c['mean']:.3f}, "
                f"{summary['confidence']:.0%} Wilson [{lo:.3f}, {hi:.3f}], n {c['n']}, failed "
                f"{c['failed']}, tokens {c['tokens']['min']}-{c['tokens']['max']})"
            )
        lines.append(f"average @ {length}: {block['average']:.2f} over {len(block['tasks'])} tasks")
    return lines


def ruler_task(
    tokenizer: Any,
    lengths: Sequence[int],
    samples: int,
    max_input_len: int,
    max_seq_len: int,
    seed: int = RULER_SEED,
) -> Task:
    """The bench task: every item's `input + answer_prefix` sent greedy with RULER's max tokens,
    scored as RULER."""
    # here, so that the probe's import of this module stays light
    from trtkv.bench.load.loadgen import Job
    from trtkv.bench.tasks.accuracy import Task
    from trtkv.bench.transport.client import SamplingParams
    from trtkv.contracts.bench_doc import RequestRecord

    specials = special_tokens(tokenizer)

    def refuse(length: int, tokens: int) -> str | None:
        if length > max_seq_len:
            return f"longer than build.max_seq_len {max_seq_len}"
        if length - tokens + specials > max_input_len:
            return (
                f"its prompts (up to {length - tokens} tokens) could exceed build.max_input_len "
                f"{max_input_len}"
            )
        return None

    items, notes = generate_items(encoder(tokenizer), lengths, samples, seed=seed, refuse=refuse)
    if not items:
        raise RulerError(
            f"bench.ruler_lengths {list(lengths)}: no RULER item could be made "
            f"({'; '.join(notes)}). Next: lengths the server takes, e.g. "
            f"bench.ruler_lengths=[{min(max_input_len, max_seq_len)}]."
        )
    jobs = []
    for i, item in enumerate(items):
        rec = RequestRecord(
            request_id=f"ruler-{i}",
            phase="ruler",
            level="ruler",
            prompt_index=i,
            input_tokens=item.input_tokens + specials,
            max_tokens=item.max_tokens,
        )
        jobs.append(Job(rec, item.prompt, SamplingParams(max_tokens=item.max_tokens)))
    base = [
        f"RULER (NVIDIA/RULER {RULER_COMMIT[:12]}) tasks {', '.join(TASK_NAMES)} at lengths "
        f"{list(lengths)}, {samples} items each, seed {seed}, 'base' template, greedy, max_tokens "
        f"{', '.join(f'{t} {max_tokens(t)}' for t in TASK_NAMES)}; score string_match_all "
        f"(percent) with a {CONFIDENCE:.0%} Wilson interval",
        *notes,
    ]
    task_notes = list(base)

    def score(records: list[RequestRecord]) -> dict[str, Any]:
        summary = summarize(items, [r.text for r in records], [r.ok for r in records])
        # the per-length table reaches results.md through the notes
        task_notes[:] = base + table_lines(summary)
        return summary

    return Task("ruler", jobs, score, task_notes)


def probe_plan(
    recipe: Recipe,
    tasks: Sequence[str] | None,
    lengths: Sequence[int] | None,
    samples: int | None,
    seed: int = RULER_SEED,
) -> RulerPlan:
    """`trtkv probe --ruler`'s items: the bench's (its tokenizer folder, encoder, seed) for the
    CLI's tasks, lengths and samples, else all six tasks, bench.ruler_lengths and
    bench.ruler_samples; with the bench's scoring functions."""
    from trtkv.bench.load.prompts import load_tokenizer, tokenizer_dir
    from trtkv.contracts.ruler import RulerPlan

    names = list(dict.fromkeys(tasks or TASK_NAMES))
    bad = [t for t in names if t not in TASK_NAMES]
    if bad:
        raise RulerError(
            f"--ruler-tasks {','.join(bad)}: unknown RULER task. Allowed: {', '.join(TASK_NAMES)}. "
            f"Next: e.g. --ruler-tasks niah_single_1,vt."
        )
    lens = sorted(set(lengths or recipe.bench.ruler_lengths))
    limit = recipe.model.max_position_embeddings
    if limit and max(lens) > limit:
        raise RulerError(
            f"RULER lengths {lens} (--ruler-lengths, else bench.ruler_lengths): {max(lens)} "
            f"exceeds the model's max_position_embeddings {limit}. Next: --ruler-lengths up to "
            f"{limit}."
        )
    count = samples if samples is not None else recipe.bench.ruler_samples
    if count < 1:
        raise RulerError(
            f"--ruler-samples {count}: must be >= 1 (bench.ruler_samples is "
            f"{recipe.bench.ruler_samples})."
        )
    folder = tokenizer_dir(recipe)
    tokenizer = load_tokenizer(folder)
    items, notes = generate_items(encoder(tokenizer), lens, count, names, seed=seed)
    return RulerPlan(
        items,
        notes,
        tokenizer,
        folder,
        names,
        lens,
        count,
        seed,
        RULER_COMMIT,
        CONFIDENCE,
        string_match_all,
        summarize,
    )
