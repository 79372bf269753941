"""Accuracy figures carry intervals (Wilson for proportions, a seeded bootstrap for golden agreement), the same
answers give the same figures and intervals, `trtkv compare` calls a difference only when intervals separate, and the
accuracy tasks run at bench.accuracy_concurrency (default 1), not at the latency sweep's highest concurrency."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from tests.support.char_tokenizer import Chars
from trtkv.bench import phases
from trtkv.bench.outputs import results
from trtkv.bench.tasks import accuracy
from trtkv.contracts.bench_doc import OK, BenchResults, RequestRecord
from trtkv.measures import stats
from trtkv.report import compare, summary


def answered(job: accuracy.Job, text: str) -> RequestRecord:
    rec = job.record
    rec.response_texts, rec.response_ns, rec.response_tokens, rec.status = [text], [1], [1], OK
    return rec



def test_wilson_and_bootstrap_intervals() -> None:
    lo, hi = stats.wilson_interval(20, 40)
    assert lo < 0.5 < hi and hi - lo == pytest.approx(0.2956, abs=1e-3)  # the textbook 95% Wilson width at n=40
    assert stats.bootstrap_interval([0.0, 1.0] * 20) == stats.bootstrap_interval([0.0, 1.0] * 20)  # seeded
    blo, bhi = stats.bootstrap_interval([0.0, 1.0] * 20)
    assert blo < 0.5 < bhi
    assert stats.bootstrap_interval([0.25] * 5) == (0.25, 0.25)
    assert all(math.isnan(x) for x in stats.bootstrap_interval([]))


def test_separated() -> None:
    assert stats.separated([0.1, 0.3], [0.35, 0.6]) is True
    assert stats.separated([0.1, 0.4], [0.35, 0.6]) is False
    assert stats.separated(None, [0.1, 0.2]) is None


def test_quiz_scores_carry_intervals_and_repeat_exactly() -> None:
    items = [{"question": c, "answer": a, "source": "x"}
             for c, a in [("Italy", "Rome"), ("Peru", "Lima"), ("Chile", "Santiago"), ("Nepal", "Kathmandu")]]
    task = accuracy.quiz_task(Chars(), items, 4)
    texts = [" Rome", " Lima", " Paris", " Kathmandu"]
    first = task.score([answered(j, t) for j, t in zip(task.jobs, texts, strict=True)])
    again = task.score([answered(j, t) for j, t in zip(task.jobs, texts, strict=True)])
    assert first == again
    assert first["accuracy"] == 0.75 and first["accuracy_ci"] == list(stats.wilson_interval(3, 4))


def test_golden_scores_carry_a_bootstrap_interval(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = {"producer": "test", "items": [{"prompt": f"p{i}", "output_ids": [ord(c) for c in " abcd"],
                                           "output_text": " abcd"} for i in range(6)]}
    monkeypatch.setattr(accuracy.golden, "load_or_make", lambda *a, **k: data)
    task = accuracy.golden_task(Chars(), [f"p{i}" for i in range(6)], 5, tmp_path / "g.json", tmp_path)
    texts = [" abcd", " abcd", " ab", " a", " abcd", " x"]
    got = task.score([answered(j, t) for j, t in zip(task.jobs, texts, strict=True)])
    assert got["agreement_ci"] == list(stats.bootstrap_interval([r["agreement"] for r in got["items"]]))
    assert got["agreement_ci"][0] < got["agreement"] < got["agreement_ci"][1]
    assert got["exact_match_ci"] == list(stats.wilson_interval(3, 6))


def test_results_md_shows_the_intervals() -> None:
    acc = {"quiz": {"accuracy": 0.5, "accuracy_ci": [0.3, 0.7], "correct": 10, "total": 20, "failed": 0},
           "golden": {"agreement": 0.8, "agreement_ci": [0.6, 0.9], "exact_match": 0.5, "exact_match_ci": [0.2, 0.8],
                      "total": 8, "failed": 0}}
    rows = results.accuracy_rows(BenchResults.model_validate({"accuracy": acc}))
    assert rows[0][3] == "[0.300, 0.700]" and rows[1][3] == "[0.600, 0.900]" and "[0.200, 0.800]" in rows[1][4]
    assert stats.interval_text(None) == "—"  # results.json written before intervals existed


def _row(name: str, value: float, ci: list[float]) -> dict[str, Any]:
    return {"recipe": name, "bench": {"quiz.accuracy": value, "quiz.accuracy.ci": ci}}


def test_compare_calls_a_difference_only_when_intervals_separate() -> None:
    rows = [_row("a", 0.50, [0.35, 0.65]), _row("b", 0.55, [0.40, 0.70]), _row("c", 0.90, [0.78, 0.96]),
            _row("d", 0.10, [0.04, 0.22]), {"recipe": "e", "bench": {"quiz.accuracy": 0.2}}]
    assert compare.accuracy_difference(rows, "quiz.accuracy").split(" | ") == [
        "(baseline)", "within noise", "higher", "lower", "no interval"]
    results = BenchResults.model_validate({"accuracy": {"quiz": {"accuracy": 0.5, "accuracy_ci": [0.3, 0.7]}}})
    headline = summary.bench_headline(results)
    assert headline["quiz.accuracy.ci"] == [0.3, 0.7]


def test_accuracy_tasks_run_at_the_recipes_accuracy_concurrency(monkeypatch: pytest.MonkeyPatch) -> None:
    from trtkv.recipe import load_recipe

    seen: list[int] = []
    monkeypatch.setattr(phases, "session_factory", lambda ep: None)
    monkeypatch.setattr(phases, "run_concurrency", lambda f, jobs, conc, *a: seen.append(conc) or [])

    class Progress:
        def phase(self, *_: Any) -> Any:
            return lambda *a: None

    task = accuracy.Task("quiz", [], lambda r: {}, [])
    recipe = load_recipe("smollm2_fp8kv", ["bench.concurrency=[1,4,8]"])
    assert recipe.bench.accuracy_concurrency == 8  # the demo recipe: the reference runtime is batch-invariant (#57) (2 x 4)
    phases.run_accuracy(recipe, None, [task], Progress(), [])  # type: ignore[arg-type]
    phases.run_accuracy(load_recipe("smollm2_fp8kv", ["bench.accuracy_concurrency=1"]), None, [task], Progress(), [])  # type: ignore[arg-type]
    assert seen == [8, 1]
