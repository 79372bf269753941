"""results.json's typed parts (trtkv.contracts.bench_doc, issue #50): every results.json under tests/ loads (an older
trtkv's included) and is written back as read; each accuracy task's entry, each request's record and the input sweep
keep the key order their writers give (results.json's bytes do not change); the report reads them by attribute."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from tests.support.char_tokenizer import Chars
from trtkv.bench.tasks import accuracy
from trtkv.contracts.bench_doc import ERROR, OK, BenchResults, BenchSweep, RequestRecord, RequestRecordDoc
from trtkv.core.errors import StageError
from trtkv.measures import sweep
from trtkv.measures.metrics import summarize_level
from trtkv.report import summary

FILES = sorted(Path(__file__).resolve().parents[1].rglob("results.json"))
# what a record of an older trtkv lacks, loaded at its default ("not measured")
NEWER_RECORD_FIELDS = {"client_lag_us": [], "client_worker": 0, "delayed": False}


def test_every_results_json_under_tests_loads_and_is_written_back_as_read() -> None:
    assert len(FILES) >= 3, FILES  # tests/data/bench_results: this trtkv's file and older ones
    exact = renamed = 0
    for path in FILES:
        loaded = BenchResults.load(path.parent)
        assert loaded is not None and loaded.records and loaded.accuracy, path
        text, doc = path.read_text(), loaded.document()
        exact += json.dumps(doc, indent=1) + "\n" == text
        written = json.loads(text)
        if "interval" in (ruler := written["accuracy"].get("ruler", {})):  # before 2026-12-08: read as accuracy_ci
            written["accuracy"]["ruler"] = {("accuracy_ci" if k == "interval" else k): v for k, v in ruler.items()}
            renamed += 1
        for got, had in zip(doc["records"], written["records"], strict=True):
            added = {k: got.pop(k) for k in list(got) if k not in had}
            assert added.items() <= NEWER_RECORD_FIELDS.items(), (path, added)
        assert json.dumps(doc) == json.dumps(written), path  # every other key and value, in its order
    assert exact >= 1 and renamed == 1  # this trtkv's own file, byte for byte; types50a's ruler wrote `interval`


def test_the_report_and_the_metrics_read_a_written_file_by_attribute() -> None:
    rulers = [p for p in FILES if "ruler" in json.loads(p.read_text())["accuracy"]]
    assert len(rulers) == 2, rulers  # types50a (ruler's `interval`) and this trtkv's (`accuracy_ci`)
    for path in rulers:
        loaded = BenchResults.load(path.parent)
        assert loaded is not None
        ruler = json.loads(path.read_text())["accuracy"]["ruler"]
        assert summary.bench_headline(loaded)["ruler.accuracy.ci"] == ruler.get("accuracy_ci", ruler.get("interval"))
    path = next(p for p in FILES if "sweep" in json.loads(p.read_text()))
    loaded = BenchResults.load(path.parent)
    assert loaded is not None and loaded.sweep is not None
    written = json.loads(path.read_text())
    headline = summary.bench_headline(loaded)
    assert headline["quiz.accuracy.ci"] == written["accuracy"]["quiz"]["accuracy_ci"]
    assert headline["golden.agreement"] == written["accuracy"]["golden"]["agreement"]
    checked = summary._checked_sweep(loaded.sweep)
    for label, level in written["sweep"]["levels"].items():  # the fits recomputed from the samples alone
        assert checked["levels"][label]["itl_fit"] == pytest.approx(level["itl_fit"])
        assert checked["levels"][label]["samples"] == level["samples"]
    # every level's figures again from the records read back (times in ms -> ns); the recipe's own length (16) was
    # one of the sweep's: its levels are the main ones
    records = [RequestRecord.from_doc(r) for r in loaded.records]
    for label, level in written["levels"].items():
        again = summarize_level([r for r in records if r.level == f"input=16 {label}" and r.phase == "latency"])
        assert again["time_to_first_token"]["p50"] == pytest.approx(level["time_to_first_token"]["p50"], abs=1e-6)



def _scored(task: accuracy.Task, texts: list[str]) -> dict[str, Any]:
    records = []
    for i, (job, text) in enumerate(zip(task.jobs, texts, strict=True)):
        rec = job.record
        rec.response_texts, rec.response_ns, rec.response_tokens = [text], [1], [1]
        rec.status = OK if i else ERROR
        records.append(rec)
    return {**task.score(records), "notes": task.notes}  # as trtkv.bench.runner.assemble adds them


def test_each_tasks_entry_is_typed_and_written_in_its_own_order(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    items = [{"question": c, "answer": a, "source": "x"} for c, a in [("Italy", "Rome"), ("Peru", "Lima")]]
    quiz = _scored(accuracy.quiz_task(Chars(), items, 2), [" Rome", " Lima"])
    needle_task = accuracy.needle_task(Chars(), "hay " * 400, [200, 99999], [0.5], 1024)
    needle = _scored(needle_task, ["x"] * len(needle_task.jobs))
    gold = {"producer": "test", "items": [{"prompt": "p", "output_ids": [32, 97], "output_text": " a"}] * 2}
    monkeypatch.setattr(accuracy.golden, "load_or_make", lambda *a, **k: gold)
    golden = _scored(accuracy.golden_task(Chars(), ["p", "p"], 2, tmp_path / "g.json", tmp_path), [" a", " b"])
    empty = accuracy.needle_task(Chars(), "hay " * 400, [99999], [0.5], 1024).score([])  # nothing measured: NaN ends
    entries = {"quiz": quiz, "needle": needle, "golden": golden, "empty": empty, "ruler": {"error": "not built"}}
    doc = BenchResults(accuracy=entries).document()
    assert json.dumps(doc["accuracy"]) == json.dumps(entries)  # each key where its task wrote it
    assert math.isnan(empty["accuracy_ci"][0])
    (tmp_path / "results.json").write_text(json.dumps({"accuracy": {"empty": {**empty, "accuracy_ci": [None, None]}}}))
    loaded = BenchResults.load(tmp_path)  # NaN is written as null (trtkv.bench.outputs.results_files)
    assert loaded is not None and loaded.accuracy["empty"].accuracy_ci == [None, None]
    typed = BenchResults(accuracy=entries).accuracy
    assert (typed["quiz"].accuracy, typed["quiz"].correct, typed["quiz"].failed) == (0.5, 1, 1)
    assert typed["needle"].by_context_length == {"200": 0.0} and typed["golden"].exact_match == 0.0
    assert typed["ruler"].error == "not built" and typed["ruler"].accuracy is None
    # results.md reads `notes` (declared last, so `items` and every figure written before it are declared too)
    assert typed["quiz"].model_extra == {} and typed["quiz"].notes == quiz["notes"] and typed["ruler"].notes == []
    assert typed["golden"].producer == "test" and typed["golden"].items == golden["items"]
    with pytest.raises(ValueError, match=r"accuracy\.quiz\.correct"):
        BenchResults.model_validate({"accuracy": {"quiz": {"correct": "two"}}})


def test_a_record_is_written_as_measured_and_read_back_to_the_same_times() -> None:
    rec = RequestRecord("r0", "latency", "concurrency=2", 0, 16, 4)
    rec.send_ns, rec.response_ns = 1_000_000, [6_500_000, 7_000_000, 7_400_000]
    rec.response_tokens, rec.response_texts = [0, 1, 2], ["", "a", "bc"]
    rec.end_ns, rec.status, rec.client_lag_us = 7_500_000, OK, [3, 4]
    written = BenchResults(records=[rec.to_doc()]).document()["records"][0]
    assert list(written) == ["request_id", "phase", "level", "prompt_index", "input_tokens", "max_tokens",
                             "response_texts", "response_tokens", "status", "error", "client_cpu_ns", "server_tokens",
                             "client_lag_us", "client_worker", "delayed", "send_time_ms", "response_times_ms",
                             "first_token_time_ms", "end_time_ms", "output_tokens"]  # turn, prefix_group: None, left out
    assert (written["send_time_ms"], written["first_token_time_ms"], written["output_tokens"]) == (1.0, 7.0, 3)
    rec.turn, rec.prefix_group = 2, 0  # the prefix-sharing workload's request carries both
    turned = BenchResults(records=[rec.to_doc()]).document()["records"][0]
    assert list(turned)[15:17] == ["turn", "prefix_group"] and (turned["turn"], turned["prefix_group"]) == (2, 0)
    back = RequestRecord.from_doc(RequestRecordDoc(**turned))
    assert back == rec and back.ttft_ms() == rec.ttft_ms() == 6.0


def test_a_record_of_another_shape_is_refused_naming_where(tmp_path: Path) -> None:
    (tmp_path / "results.json").write_text(json.dumps({"records": [{"request_id": "r", "phase": "latency"}]}))
    with pytest.raises(StageError, match=r"records\.0\.level: Field required and 5 more.*rerun `trtkv bench`"):
        BenchResults.load(tmp_path)


def test_the_sweep_is_typed_and_written_as_summarized() -> None:
    class Rec:
        ok = True

        def __init__(self, n: int) -> None:
            self.n = n

        def ttft_ms(self) -> float:
            return 0.01 * self.n + 1

        def itl_ms(self) -> float:
            return 0.001 * self.n + 2

    by_length = {n: {"concurrency=1": [Rec(n), Rec(n)]} for n in (128, 512, 2048)}
    clients = {128: {"concurrency=1": {"workers": 1, "decided": "auto", "core_share": 0.5, "cpu_cores": 0.2,
                                        "lag_ms": {"unit": "ms", "p50": 0.1, "p99": 0.2, "max": 0.3, "count": 4},
                                        "per_worker": []}}}
    written = sweep.summarize(by_length, clients)
    typed = BenchSweep.model_validate(written)
    assert json.dumps(BenchResults(sweep=typed).document()["sweep"]) == json.dumps(written)
    level = typed.levels["concurrency=1"]
    assert typed.input_tokens == [128, 512, 2048] and level.samples["512"].itl_ms == [2.512, 2.512]
    assert level.itl_fit is not None and level.itl_fit["slope"] == pytest.approx(0.001)
    assert level.client["128"].cpu_cores == 0.2 and level.client["128"].core_share is None  # the per-length subset
