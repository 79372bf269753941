"""RULER's tasks as trtkv makes them: determinism, lengths on the real SmolLM2 tokenizer, RULER's templates and answer
prefixes, answers placed as RULER places them, string_match_all scoring, and the `ruler` bench task end to end."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from trtkv.bench.load.prompts import load_tokenizer
from trtkv.bench.outputs.results import accuracy_rows
from trtkv.bench.tasks import ruler, ruler_families
from trtkv.contracts.bench_doc import ERROR, OK, BenchResults, RequestRecord
from trtkv.core.errors import ToolError
from trtkv.measures.stats import interval_text, wilson_interval
from trtkv.report.summary import bench_headline

TASKS = ["niah_single_1", "niah_multikey_2", "niah_multikey_3", "vt", "cwe", "fwe"]


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir: Path):  # noqa: ANN201
    return load_tokenizer(smollm2_dir)


@pytest.fixture(scope="module")
def encode(tokenizer):  # noqa: ANN001, ANN201
    return lambda text: tokenizer.encode(text, add_special_tokens=False)


@pytest.fixture(scope="module")
def items_2048(encode) -> dict[str, list[ruler.RulerItem]]:  # noqa: ANN001
    return {task: ruler.generate(task, 2048, 3, encode) for task in TASKS}


def test_the_six_tasks_and_their_generation_budgets() -> None:
    assert list(ruler.TASK_NAMES) == TASKS
    # scripts/data/synthetic/constants.py tokens_to_generate at RULER c3f5e3b
    assert {t: ruler.max_tokens(t) for t in TASKS} == {"niah_single_1": 128, "niah_multikey_2": 128,
                                                      "niah_multikey_3": 128, "vt": 30, "cwe": 120, "fwe": 50}


def test_generation_is_deterministic_and_json_round_trips(encode) -> None:  # noqa: ANN001
    for task in TASKS:
        first = [i.to_json() for i in ruler.generate(task, 1024, 2, encode, seed=7)]
        again = [i.to_json() for i in ruler.generate(task, 1024, 2, encode, seed=7)]
        other = [i.to_json() for i in ruler.generate(task, 1024, 2, encode, seed=8)]
        assert first == again, task
        assert [i["input"] for i in first] != [i["input"] for i in other], task
        assert first[0]["input"] != first[1]["input"], task  # items differ from one another
        back = [ruler.RulerItem.from_json(d) for d in json.loads(json.dumps(first))]
        assert [b.to_json() for b in back] == first


@pytest.mark.parametrize("task", TASKS)
def test_lengths_fit_the_target_on_the_real_tokenizer(items_2048, encode, task: str) -> None:  # noqa: ANN001
    # fwe keeps RULER's own search (grow by 1/32 of the budget, step back once): its items sit up to ~14% short
    tolerance = 0.15 if task == "fwe" else 0.04
    for item in items_2048[task]:
        total = len(encode(item.prompt)) + item.max_tokens
        assert total == item.input_tokens + item.max_tokens
        assert 2048 * (1 - tolerance) <= total <= 2048, (task, total)


def test_a_length_too_short_for_a_task_is_refused_with_the_reason(encode) -> None:  # noqa: ANN001
    with pytest.raises(ruler.RulerError, match="too short"):
        ruler.generate("cwe", 300, 1, encode)
    items, notes = ruler.generate_items(encode, [400], 1, tasks=["niah_single_1", "cwe"])
    assert {i.task for i in items} == {"niah_single_1"} and len(notes) == 1 and notes[0].startswith("cwe @ 400 not run")


def test_niah_templates_and_needles_are_rulers(items_2048) -> None:  # noqa: ANN001
    for task, kind in (("niah_single_1", r"\d{7}"), ("niah_multikey_2", r"\d{7}"),
                       ("niah_multikey_3", r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")):
        for item in items_2048[task]:
            (answer,) = item.outputs
            assert re.fullmatch(kind, answer)
            # one answer: RULER's singular wording ('Some' -> 'A', 'are' -> 'is', numbers -> number)
            noun = "number" if kind == r"\d{7}" else "uuid"
            assert item.input.startswith(f"A special magic {noun} is hidden within the following text. Make sure to "
                                         f"memorize it. I will quiz you about the {noun} afterwards.\n")
            key = re.search(rf"One of the special magic {noun}s for (.+?) is: {re.escape(answer)}\.", item.input)[1]
            assert item.input.endswith(f"\nWhat is the special magic {noun} for {key} mentioned in the provided text?")
            assert item.answer_prefix == f" The special magic {noun} for {key} mentioned in the provided text is"
            assert item.prompt.count(answer) == 1, task  # the answer occurs exactly once
            assert item.input.count(f" for {key} is: ") == 1
            lines = item.input.split("\n")[1:-1]
            if task == "niah_single_1":  # noise haystack: RULER's sentence, one needle among them
                assert set(lines) == {ruler_families.NOISE, f"One of the special magic numbers for {key} is: {answer}."}
            else:  # needle haystack: every line a needle of the same form, distractors with other keys
                assert len(lines) == item.haystack_units + 1
                assert all(re.fullmatch(rf"One of the special magic {noun}s for .+ is: {kind}\.", x) for x in lines)
            if task != "niah_multikey_3":
                assert re.fullmatch(r"[^-]+(-[^-]+)+", key)  # adjective-noun from wonderwords (some hold a space: "ad hoc")


def test_variable_tracking_is_rulers(items_2048) -> None:  # noqa: ANN001
    for item in items_2048["vt"]:
        names = item.outputs
        assert len(names) == 5 and all(re.fullmatch(r"[A-Z]{5}", n) for n in names)
        value = re.search(rf"VAR {names[0]} = (\d{{5}})\n", item.input)[1]
        assert item.answer_prefix == (" Answer: According to the chain(s) of variable assignment in the text above, 5 "
                                      f"variables are assigned the value {value}, they are: ")
        one_shot, main = item.input.split("\n\nMemorize and track", 1)
        assert one_shot.startswith("Memorize and track the chain(s) of variable assignment hidden in the following "
                                   "text.\n\n")  # the one-shot example first; RULER joins its answer with a space
        assert re.search(r", they are:  [A-Z]{3} [A-Z]{3} [A-Z]{3} [A-Z]{3} [A-Z]{3}$", one_shot)
        assert main.endswith(f"\nQuestion: Find all variables that are assigned the value {value} in the text above.")
        chain = [f"VAR {names[0]} = {value}"] + [f"VAR {names[j + 1]} = VAR {names[j]} " for j in range(4)]
        lines = main.split("\n")
        positions = [lines.index(c) for c in chain]
        assert positions == sorted(positions) and all(lines.count(c) == 1 for c in chain)
        assert item.input.count(f"= {value}\n") == 1  # the value is assigned once
        assert sum(line == ruler_families.NOISE for line in lines) == item.haystack_units


def test_common_and_frequent_words_are_rulers(items_2048) -> None:  # noqa: ANN001
    for item in items_2048["cwe"]:
        assert item.answer_prefix == " Answer: The top 10 words that appear most often in the list are:"
        assert item.input.endswith("\nQuestion: What are the 10 most common words in the above list?")
        assert item.input.count("Below is a numbered list of words.") == 2  # one-shot example, then the task
        body = item.input.rsplit("Memorize the ones that appear most often.\n", 1)[1].split("\nQuestion:", 1)[0]
        listed = re.split(r"(?:^| )\d+\. ", body)[1:]  # "1. word 2. word ..." (a few words hold a space)
        assert body.startswith("1. ") and len(listed) == 6 * 10 + item.haystack_units - 10
        assert len(item.outputs) == 10 and len(set(listed)) == item.haystack_units
        # below 4096 tokens RULER repeats the 10 common words 6 times and every other word once
        assert all(listed.count(w) == 6 for w in item.outputs)
        assert sorted(listed.count(w) for w in set(listed) - set(item.outputs)) == [1] * (item.haystack_units - 10)
    for item in items_2048["fwe"]:
        assert item.answer_prefix == " Answer: According to the coded text above, the three most frequently appeared " \
                                     "words are:"
        assert item.input.startswith("Read the following coded text and track the frequency of each coded word. Find "
                                     "the three most frequently appeared coded words. ")
        words = item.input.split("coded words. ", 1)[1].split("\nQuestion:", 1)[0].split(" ")
        counts = {w: words.count(w) for w in set(words)}
        ranked = sorted(counts, key=lambda w: -counts[w])
        assert ranked[0] == "..." and ranked[1:4] == item.outputs  # '...' is noise; the answer is ranks 2-4
        assert counts[item.outputs[2]] > max(c for w, c in counts.items() if w not in ("...", *item.outputs))


def test_missing_wonderwords_names_the_install(monkeypatch: pytest.MonkeyPatch, encode) -> None:  # noqa: ANN001
    for cached in (ruler_families.wordlists, ruler_families._niah_word_parts, ruler_families.cwe_words):
        cached.cache_clear()
    monkeypatch.setitem(sys.modules, "wonderwords", None)
    monkeypatch.setitem(sys.modules, "wonderwords.assets", None)
    try:
        with pytest.raises(ToolError, match=r"pip install 'wonderwords==3\.0\.1'"):
            ruler.generate("niah_single_1", 1024, 1, encode)
        assert len(ruler.generate("niah_multikey_3", 1024, 1, encode)) == 1  # uuids need no word list
    finally:
        for cached in (ruler_families.wordlists, ruler_families._niah_word_parts, ruler_families.cwe_words):
            cached.cache_clear()


def test_string_match_all_is_rulers_rule() -> None:
    assert ruler.string_match_all(" The answer is 1234567.", ["1234567"]) == 1.0
    assert ruler.string_match_all("ABCDE, fghij and KLMNO", ["abcde", "FGHIJ", "klmno", "PQRST"]) == 0.75
    assert ruler.string_match_all("nothing here", ["x1", "x2"]) == 0.0
    assert ruler.string_match_all("\n\tfoo\x01bar  ", ["foo\nbar"]) == 1.0  # control characters become newlines
    assert ruler.postprocess("  a\x00b \n") == "a\nb"
    # RULER's aggregate: the mean of the items' fractions, in percent, rounded to 2 decimals
    assert ruler.ruler_score(["a b", "a", "z"], [["a", "b"], ["a", "b", "c"], ["z"]]) == round((1 + 1 / 3 + 1) / 3 * 100, 2)


def test_wilson_interval() -> None:
    lo, hi = wilson_interval(5, 10)
    assert (round(lo, 4), round(hi, 4)) == (0.2366, 0.7634)
    assert wilson_interval(0, 10)[0] == 0.0 and round(wilson_interval(0, 10)[1], 4) == 0.2775
    assert wilson_interval(10, 10)[1] == 1.0
    assert all(v != v for v in wilson_interval(0, 0))  # NaN without data


def answered(job, text: str, status: str = OK) -> RequestRecord:  # noqa: ANN001
    rec = job.record
    rec.response_texts, rec.response_ns, rec.response_tokens, rec.status = [text], [1], [1], status
    return rec


def test_bench_task_scores_per_length_and_task(tokenizer) -> None:  # noqa: ANN001
    task = ruler.ruler_task(tokenizer, [1024, 8192], 2, max_input_len=2048, max_seq_len=4096)
    assert task.name == "ruler" and len(task.jobs) == 12  # 8192 refused: longer than the server takes
    assert sum("@ 8192 not run: longer than build.max_seq_len 4096" in n for n in task.notes) == 6
    items = ruler.generate_items(lambda t: tokenizer.encode(t, add_special_tokens=False), [1024], 2)[0]
    assert [j.prompt for j in task.jobs] == [i.prompt for i in items]
    assert [j.params.max_tokens for j in task.jobs] == [i.max_tokens for i in items]
    assert all(j.params.temperature == 0.0 and j.params.top_k == 1 for j in task.jobs)
    preds = [" " + ", ".join(i.outputs).upper() if i.task != "cwe" else " " + " ".join(i.outputs[:5]) for i in items]
    recs = [answered(j, p) for j, p in zip(task.jobs, preds, strict=True)]
    recs[0] = answered(task.jobs[0], preds[0], status=ERROR)  # a failed request scores 0
    result = task.score(recs)
    entry = {**result, "notes": task.notes}  # results.json's accuracy.ruler: typed, written key for key in its order
    written = BenchResults(accuracy={"ruler": entry})
    assert json.dumps(written.document()["accuracy"]["ruler"]) == json.dumps(entry)
    scored = written.accuracy["ruler"]
    assert scored.by_length is not None and scored.items == result["items"]
    cells = scored.by_length["1024"].tasks
    assert list(cells) == TASKS and scored.total == 12 and scored.failed == 1
    assert cells["niah_single_1"].score == 50.0 and cells["niah_single_1"].failed == 1
    assert cells["cwe"].mean == 0.5 and cells["cwe"].all_found == 0 and cells["cwe"].tokens["min"] > 0
    assert all(cells[t].score == 100.0 for t in ("niah_multikey_2", "niah_multikey_3", "vt", "fwe"))
    assert scored.by_length["1024"].average == round((50 + 100 * 4 + 50) / 6, 2)
    assert result["accuracy"] == pytest.approx(10 / 12) and result["correct"] == 9
    lo, hi = result["accuracy_ci"]  # under every task's name: results.md's accuracy table shows it
    assert lo < 10 / 12 < hi and (lo, hi) == wilson_interval(10, 12) and scored.accuracy_ci == [lo, hi]
    assert accuracy_rows(written)[0][:4] == ["ruler", "ruler.accuracy", "0.833", interval_text([lo, hi])]
    assert bench_headline(written)["ruler.accuracy.ci"] == [lo, hi]  # what `trtkv compare` and the summary read
    assert any(n.startswith("niah_single_1 @ 1024: 50.00") for n in task.notes)  # the table reaches results.md


def test_bench_task_with_no_length_the_server_takes_says_what_to_set(tokenizer) -> None:  # noqa: ANN001
    with pytest.raises(ruler.RulerError, match=r"bench.ruler_lengths \[8192\].*Next: .*bench.ruler_lengths=\[2048\]"):
        ruler.ruler_task(tokenizer, [8192], 1, max_input_len=2048, max_seq_len=4096)
