"""Accuracy task construction and scoring on synthetic records (no server): quiz, golden agreement, needle, prompts."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtkv.bench.load.prompts import cut_to_tokens, latency_prompts, load_tokenizer, long_text, prompt_tokens
from trtkv.bench.tasks import accuracy, golden
from trtkv.contracts.bench_doc import ERROR, OK, RequestRecord


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir: Path):  # noqa: ANN201
    return load_tokenizer(smollm2_dir)


def answered(job: accuracy.Job, text: str, status: str = OK) -> RequestRecord:
    rec = job.record
    rec.response_texts, rec.response_ns, rec.response_tokens, rec.status = [text], [1], [1], status
    return rec


def test_prompts_have_exact_token_counts(tokenizer) -> None:  # noqa: ANN001
    prompts = latency_prompts(tokenizer, 5, 64)
    assert len(set(prompts)) == 5
    assert [prompt_tokens(tokenizer, p) for p in prompts] == [64] * 5
    assert prompt_tokens(tokenizer, cut_to_tokens(tokenizer, long_text()[:20000], 300)) == 300


def test_quiz_scoring(tokenizer) -> None:  # noqa: ANN001
    items = [{"question": "Italy", "answer": "Rom[e|a]", "source": "x"},
             {"question": "Colombia", "answer": "Bogot['\ba|a\b'|a]", "source": "x"},
             {"question": "Peru", "answer": "Lima", "source": "x"}]
    task = accuracy.quiz_task(tokenizer, items, 3)
    assert task.jobs[0].prompt.endswith("capital of Italy?\nA:") and task.jobs[0].params.max_tokens == 10
    recs = [answered(task.jobs[0], " Rome\n\nQ: What"), answered(task.jobs[1], " Bogotá"),
            answered(task.jobs[2], " Lima", status=ERROR)]
    result = task.score(recs)
    assert (result["correct"], result["total"], result["failed"]) == (2, 3, 1)
    assert result["accuracy"] == pytest.approx(2 / 3)


def test_golden_agreement_counts_reproduced_tokens(tokenizer) -> None:  # noqa: ANN001
    ids = tokenizer.encode(" and the light shineth in darkness", add_special_tokens=False)
    assert golden.agreement(tokenizer, ids, " and the light shineth in darkness") == 1.0
    partial = golden.agreement(tokenizer, ids, " and the light went out")
    assert 0 < partial < 1
    assert golden.agreement(tokenizer, ids, "Nothing alike") == 0.0


def test_golden_task_uses_stored_file_when_key_matches(tmp_path: Path, tokenizer, smollm2_dir: Path) -> None:  # noqa: ANN001
    prompts = ["In the beginning was the Word,", "Blessed are the meek:"]
    key = golden.golden_key(smollm2_dir, prompts, 4)
    path = tmp_path / "golden.json"
    items = [{"prompt": p, "output_ids": tokenizer.encode(" x y", add_special_tokens=False), "output_text": " x y"}
             for p in prompts]
    path.write_text(__import__("json").dumps({"key": key, "producer": "test", "items": items}))
    task = accuracy.golden_task(tokenizer, prompts, 4, path, smollm2_dir, log=lambda s: None)
    result = task.score([answered(task.jobs[0], " x y"), answered(task.jobs[1], " x z")])
    assert result["exact_match"] == 0.5 and 0.5 < result["agreement"] < 1.0


def test_needle_prompts(tokenizer) -> None:  # noqa: ANN001
    task = accuracy.needle_task(tokenizer, long_text(), [256, 9000], [0.1, 0.9], max_seq_len=4096)
    assert len(task.jobs) == 2 and any("9000 skipped" in n for n in task.notes)
    for job in task.jobs:
        assert abs(job.record.input_tokens - 256) <= 3
        assert "The pass key is" in job.prompt and job.prompt.endswith("The pass key is")
    key = task.score([answered(j, " 12345.") for j in task.jobs])
    assert key["total"] == 2 and key["by_context_length"] == {"256": 0.0}
