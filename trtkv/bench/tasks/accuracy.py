"""Accuracy tasks against the server: (a) capital-city quiz, (b) agreement with golden outputs, (c)
needle retrieval.

Each task turns into ordinary streamed requests (greedy: temperature 0, top_k 1) and a scorer over
their records. A request that fails counts as wrong and is reported in `failed`. Every figure
carries its 95% interval (`*_ci`): Wilson for the proportions (quiz and needle accuracy, golden
exact match), a seeded bootstrap over prompts for the mean golden agreement, so the same answers
always give the same intervals.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtkv.bench.load.loadgen import Job
from trtkv.bench.load.prompts import prompt_tokens
from trtkv.bench.tasks import golden
from trtkv.bench.transport.client import SamplingParams
from trtkv.contracts.bench_doc import RequestRecord
from trtkv.measures.stats import CONFIDENCE, bootstrap_interval, wilson_interval
from trtkv.runtime import quiz_patterns as quiz

QUIZ_MAX_TOKENS = 10
NEEDLE_MAX_TOKENS = 8
NEEDLE_QUESTION = (
    "\n\nQuestion: What is the pass key mentioned in the text above?\nAnswer: The pass key is"
)


@dataclass
class Task:
    name: str
    jobs: list[Job]
    score: Callable[[list[RequestRecord]], dict[str, Any]]
    notes: list[str]


def _job(task: str, i: int, tokenizer: Any, prompt: str, max_tokens: int) -> Job:
    rec = RequestRecord(
        request_id=f"{task}-{i}",
        phase=task,
        level=task,
        prompt_index=i,
        input_tokens=prompt_tokens(tokenizer, prompt),
        max_tokens=max_tokens,
    )
    return Job(rec, prompt, SamplingParams(max_tokens=max_tokens))


def _proportion(
    rows: list[dict[str, Any]], records: list[RequestRecord], **more: Any
) -> dict[str, Any]:
    """A task scored right or wrong per item: its accuracy with the Wilson interval, the failed
    requests, `more`, then the items."""
    correct = sum(r["correct"] for r in rows)
    return {
        "accuracy": correct / max(1, len(rows)),
        "accuracy_ci": list(wilson_interval(correct, len(rows))),
        "confidence": CONFIDENCE,
        "correct": correct,
        "total": len(rows),
        "failed": sum(not r.ok for r in records),
        **more,
        "items": rows,
    }


def first_line(text: str) -> str:
    stripped = text.strip()
    return stripped.split("\n", 1)[0].strip() if stripped else ""


# --------------------------------------------------------------------------------------------------
# (a) quiz


def quiz_task(tokenizer: Any, items: Sequence[dict[str, str]], count: int) -> Task:
    """`count` capital-city questions (few-shot prompt), scored by exact-prefix match against the
    quiz pattern."""
    chosen = quiz.pick_items(items, count, exclude=[q for q, _ in quiz.FEW_SHOT])
    jobs = [
        _job(
            "quiz", i, tokenizer, quiz.few_shot_prompt(quiz.render(it["question"])), QUIZ_MAX_TOKENS
        )
        for i, it in enumerate(chosen)
    ]

    def score(records: list[RequestRecord]) -> dict[str, Any]:
        rows: list[dict[str, Any]] = []
        for rec, it in zip(records, chosen, strict=True):
            answer = first_line(rec.text)
            rows.append(
                {
                    "question": quiz.render(it["question"]),
                    "pattern": it["answer"],
                    "output": answer,
                    "status": rec.status,
                    "correct": rec.ok and quiz.is_correct(it["answer"], answer),
                }
            )
        return _proportion(rows, records)

    return Task(
        "quiz",
        jobs,
        score,
        [
            f"{len(chosen)} of {len(items)} questions, {len(quiz.FEW_SHOT)}-shot prompt, "
            f"max_tokens {QUIZ_MAX_TOKENS}, first line scored"
        ],
    )


# --------------------------------------------------------------------------------------------------
# (b) golden


def golden_task(
    tokenizer: Any,
    prompts: Sequence[str],
    max_tokens: int,
    golden_path: Path,
    model_dir: Path,
    log: Callable[[str], None] = print,
) -> Task:
    """The same prompts as the unquantized model's stored outputs; agreement = golden tokens
    reproduced."""
    data = golden.load_or_make(golden_path, model_dir, prompts, max_tokens, log=log)
    items = data["items"]
    jobs = [_job("golden", i, tokenizer, it["prompt"], max_tokens) for i, it in enumerate(items)]

    def score(records: list[RequestRecord]) -> dict[str, Any]:
        rows = []
        for rec, it in zip(records, items, strict=True):
            agree = golden.agreement(tokenizer, it["output_ids"], rec.text) if rec.ok else 0.0
            rows.append(
                {
                    "prompt_index": rec.prompt_index,
                    "status": rec.status,
                    "agreement": agree,
                    "exact": rec.ok and rec.text == it["output_text"],
                    "golden": it["output_text"],
                    "served": rec.text,
                }
            )
        n, exact = max(1, len(rows)), sum(r["exact"] for r in rows)
        return {
            "agreement": sum(r["agreement"] for r in rows) / n,
            "agreement_ci": list(bootstrap_interval([r["agreement"] for r in rows])),
            "exact_match": exact / n,
            "exact_match_ci": list(wilson_interval(exact, len(rows))),
            "confidence": CONFIDENCE,
            "total": len(rows),
            "failed": sum(not r.ok for r in records),
            "golden_file": str(golden_path),
            "producer": data.get("producer"),
            "items": rows,
        }

    return Task(
        "golden",
        jobs,
        score,
        [f"{len(items)} prompts, max_tokens {max_tokens}, golden: {data.get('producer')}"],
    )


# --------------------------------------------------------------------------------------------------
# (c) needle


def needle_prompt(
    tokenizer: Any, haystack_ids: Sequence[int], length: int, depth: float, key: int
) -> str:
    """About `length` tokens of haystack with the pass key paragraph at relative `depth`, then the
    question (this layout is the one SmolLM2-135M unquantized answers at 2 of 3 depths at 512
    tokens; inline needles it missed)."""
    needle = f"\n\nThe pass key is {key}. Remember it. {key} is the pass key.\n\n"
    budget = length - prompt_tokens(tokenizer, needle) - prompt_tokens(tokenizer, NEEDLE_QUESTION)
    hay = list(haystack_ids[: max(0, budget)])
    cut = int(len(hay) * depth)
    decode = lambda ids: tokenizer.decode(  # noqa: E731
        ids, skip_special_tokens=True, clean_up_tokenization_spaces=False
    )
    return decode(hay[:cut]).rstrip() + needle + decode(hay[cut:]).lstrip() + NEEDLE_QUESTION


def needle_task(
    tokenizer: Any,
    long_text: str,
    lengths: Sequence[int],
    depths: Sequence[float],
    max_seq_len: int,
) -> Task:
    """A 5-digit pass key hidden at each depth of a haystack of each length; right when the answer
    contains it."""
    ids = tokenizer.encode(long_text, add_special_tokens=False)
    jobs: list[Job] = []
    meta: list[dict[str, Any]] = []
    notes: list[str] = []
    for length in lengths:
        if length + NEEDLE_MAX_TOKENS > max_seq_len:
            notes.append(
                f"context {length} skipped: {length} + {NEEDLE_MAX_TOKENS} > build.max_seq_len "
                f"{max_seq_len}"
            )
            continue
        offset = (length * 7) % max(1, len(ids) - length)
        for depth in depths:
            key = random.Random(length * 1000 + round(depth * 100)).randint(10000, 99999)
            prompt = needle_prompt(tokenizer, ids[offset : offset + length], length, depth, key)
            jobs.append(_job("needle", len(jobs), tokenizer, prompt, NEEDLE_MAX_TOKENS))
            meta.append({"context_length": length, "depth": depth, "key": key})

    def score(records: list[RequestRecord]) -> dict[str, Any]:
        rows = [
            {
                **m,
                "input_tokens": rec.input_tokens,
                "status": rec.status,
                "output": first_line(rec.text),
                "correct": rec.ok and str(m["key"]) in rec.text,
            }
            for rec, m in zip(records, meta, strict=True)
        ]
        by_length: dict[str, float] = {}
        by_length_ci: dict[str, list[float]] = {}
        for length in sorted({r["context_length"] for r in rows}):
            sel = [r for r in rows if r["context_length"] == length]
            hits = sum(r["correct"] for r in sel)
            by_length[str(length)] = hits / len(sel)
            by_length_ci[str(length)] = list(wilson_interval(hits, len(sel)))
        return _proportion(
            rows, records, by_context_length=by_length, by_context_length_ci=by_length_ci
        )

    notes.insert(
        0, f"context lengths {list(lengths)}, depths {list(depths)}, max_tokens {NEEDLE_MAX_TOKENS}"
    )
    return Task("needle", jobs, score, notes)
