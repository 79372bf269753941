"""`trtkv plan` leads with a one-screen answer (#54 item 9): for every shipped recipe, at most 12 lines of at most 100
characters holding the KV pool, the sequences per replica and the recommended format with why; `--full` adds the terms,
tables, advice and notes under it, the prose wrapped to the width; `--json` is the snapshot's (tests/snapshots)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtkv.cli import main
from trtkv.cli.plan_summary import SUMMARY_WIDTH, wrap

RECIPES = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "recipes").glob("*.yaml"))


def _answer(text: str) -> list[str]:
    """The lines before the first blank one."""
    lines = text.splitlines()
    return lines[: lines.index("")] if "" in lines else lines


@pytest.mark.parametrize("recipe", RECIPES)
def test_plan_leads_with_one_screen(recipe: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", recipe]) == 0
    text = capsys.readouterr().out
    answer = _answer(text)
    assert len(answer) <= 12 and all(len(line) <= SUMMARY_WIDTH for line in answer), answer
    heads = [line.split(":")[0] for line in answer]
    assert {"KV pool", "Sequences", "Recommended", "Why"} <= set(heads), answer
    assert " GiB per GPU " in answer[heads.index("KV pool")]
    assert " per replica at " in answer[heads.index("Sequences")]
    assert answer[heads.index("Recommended")].endswith(" KV")
    assert len(text.splitlines()) <= 14 and f"trtkv plan {recipe} --full" in text  # the rest behind --full


def test_full_keeps_everything_under_the_answer(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "llama70b_fp8kv"]) == 0
    short = capsys.readouterr().out
    assert main(["plan", "llama70b_fp8kv", "--full"]) == 0
    full = capsys.readouterr().out
    assert full.startswith("\n".join(_answer(short)) + "\n\n")
    for part in ("KV pool per GPU: ", "  - weights ", "seqs@32K", "Decode step lower bound", "Prefix cache: ",
                 "Advice (", "Note: "):
        assert part in full, part
    prose = [line for line in full.splitlines() if line.startswith(("Note: ", "  - ", "Advice", "  rule read"))]
    assert prose and all(len(line) <= SUMMARY_WIDTH for line in prose)
    assert max(len(line) for line in short.splitlines()) <= SUMMARY_WIDTH


def test_wrap_keeps_words_whole() -> None:
    line = "Note: " + " ".join(["word"] * 40) + " /a/very/long/path/" + "x" * 120
    out = wrap(line, 60, "  ")
    assert out[0].startswith("Note: ") and all(x.startswith("    ") for x in out[1:])
    assert " ".join(x.strip() for x in out) == line and all(len(x) <= 60 for x in out if "/" not in x)
