"""The bsdgames quiz answer matcher: {optional}, [a|b], |, \\ quoting, backspace overstrikes, exact prefix."""

from __future__ import annotations

import pytest

from trtkv.core.texts import quiz_items
from trtkv.runtime import quiz_patterns as quiz


@pytest.mark.parametrize(("pattern", "answer", "ok"), [
    ("Paris", "Paris", True),
    ("Paris", " paris.\nQ: next", True),
    ("Paris", "Parisian", False),
    ("Paris", "The capital is Paris", False),  # exact prefix, not "contains"
    ("Bern{e}", "Bern", True),
    ("Bern{e}", "Berne", True),
    ("Bern{e}", "Berner", False),
    ("Washington{ DC}", "Washington DC, USA", True),
    ("Washington{ DC}", "Washington", True),
    ("Rom[e|a]", "Roma", True),
    ("Rom[e|a]", "Romo", False),
    ("Port[-| ]au[-| ]Prince", "Port au-Prince", True),
    ("Vienna|Wien", "Wien", True),
    ("Brussel{s}|Bruxelles", "Bruxelles", True),
    ("Wars[aw|zawa]", "Warszawa", True),
    ("Bogot['\ba|a\b'|a]", "Bogotá", True),
    ("Bogot['\ba|a\b'|a]", "Bogota", True),
    ("Bogot['\ba|a\b'|a]", "BOGOTÁ!", True),
    ("Yaound['\be|e\b'|e]", "Yaoundè", True),  # accents are folded on both sides
    ("K[o|o\b/|/\bo]benhavn", "København", True),
    ("Chi[,\bs|s\b,|s]inau|Kishinev", "Chişinău", True),
    ("P{'}yongyang", "Pyongyang", True),
    ("P{'}yongyang", "P'yongyang", True),
    ("N'Djamena|Ndjamena", "N’Djamena", True),
    ("San Jos['\be|e\b'|e]", "SanJose", False),
    ("a\\|b", "a|b", True),  # a quoted bar is a literal
    ("Paris", "", False),
])
def test_is_correct(pattern: str, answer: str, ok: bool) -> None:
    assert quiz.is_correct(pattern, answer) is ok


def test_overstrike_composes_accents() -> None:
    assert quiz.compose("'", "e") == "é" and quiz.compose("e", "'") == "é"
    assert quiz.compose("^", "o") == "ô" and quiz.compose("/", "o") == "ø"
    assert quiz.compose("°", "A") == "Å" and quiz.compose(",", "c") == "ç"


def test_render_takes_full_first_alternative() -> None:
    assert quiz.render("C[^\bo|o\b^|o]te d'Ivoire") == "Côte d'Ivoire"
    assert quiz.render("Central Africa{n Rep{ublic}}") == "Central African Republic"
    assert quiz.render("United States|US{A}") == "United States"
    assert quiz.render("{The }Gambia") == "The Gambia"


def test_unbalanced_pattern_is_an_error() -> None:
    with pytest.raises(quiz.PatternError):
        quiz.compile_pattern("Rom[e|a")
    with pytest.raises(quiz.PatternError):
        quiz.compile_pattern("Rome}")


def test_every_shipped_item_accepts_its_own_rendered_answer() -> None:
    items = quiz_items()
    assert len(items) == 221
    for it in items:
        assert quiz.is_correct(it["answer"], quiz.render(it["answer"])), it


def test_pick_items_is_spread_deterministic_and_skips_few_shot() -> None:
    items = quiz_items()
    picked = quiz.pick_items(items, 40, exclude=[q for q, _ in quiz.FEW_SHOT])
    assert len(picked) == 40 and picked == quiz.pick_items(items, 40, exclude=[q for q, _ in quiz.FEW_SHOT])
    assert not {quiz.render(p["question"]) for p in picked} & {q for q, _ in quiz.FEW_SHOT}
    assert {p["source"] for p in picked} == {it["source"] for it in items}  # all four regions


def test_few_shot_prompt_ends_with_the_question() -> None:
    prompt = quiz.few_shot_prompt("Peru")
    assert prompt.endswith("Q: What is the capital of Peru?\nA:")
    assert prompt.count("Q:") == len(quiz.FEW_SHOT) + 1
