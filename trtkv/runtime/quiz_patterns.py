"""bsdgames quiz(6) answer patterns, shared by `trtkv bench`'s quiz task and the runtime's quiz
agreement: `{optional}`, `[a|b]`, `a|b`, `\\` quoting, `X<BS>Y` overstrike accents.

A model's answer is right when it starts with one accepted string (exact prefix, case- and
accent-insensitive, followed by a non-word character or the end). Overstrikes are composed into
accented letters and accents are folded on both sides, so `Bogot['<BS>a|a<BS>'|a]` accepts "Bogotá"
and "Bogota".
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

BS = "\b"
COMBINING = {
    "'": "\u0301",
    "`": "\u0300",
    "^": "\u0302",
    "~": "\u0303",
    '"': "\u0308",
    ",": "\u0327",
    "°": "\u030a",
}
SPECIAL = {("/", "o"): "ø", ("/", "O"): "Ø"}
FOLD_EXTRA = str.maketrans(
    {"ø": "o", "Ø": "O", "æ": "ae", "Æ": "AE", "ß": "ss", "đ": "d", "ł": "l", "’": "'"}
)


class PatternError(ValueError):
    """A malformed quiz pattern (unbalanced brackets)."""


def compose(a: str, b: str) -> str:
    """The letter drawn by overstriking `a` and `b` (either order), e.g. ("'", "e") -> "é"."""
    for mark, letter in ((a, b), (b, a)):
        if (mark, letter) in SPECIAL:
            return SPECIAL[(mark, letter)]
        if mark in COMBINING and letter.isalpha():
            return unicodedata.normalize("NFC", letter + COMBINING[mark])
    return b


def _tokens(pattern: str) -> list[tuple[str, str]]:
    """("lit", char) or ("op", one of {}[]|); escapes and overstrikes resolved, a trailing `\\`
    dropped."""
    out: list[tuple[str, str]] = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            if i + 1 < len(pattern):
                out.append(("lit", pattern[i + 1]))
            i += 2
            continue
        if i + 2 < len(pattern) and pattern[i + 1] == BS:
            out.append(("lit", compose(ch, pattern[i + 2])))
            i += 3
            continue
        out.append(("op", ch) if ch in "{}[]|" else ("lit", ch))
        i += 1
    return out


class _Parser:
    """Recursive descent over the tokens: alt := seq ('|' seq)* ; seq := ('{' alt '}' | '[' alt ']'
    | lit)*."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self.toks = _tokens(pattern)
        self.pos = 0

    def parse(self) -> list:
        tree = self.alt()
        if self.pos != len(self.toks):
            raise PatternError(
                f"unbalanced {self.toks[self.pos][1]!r} in quiz pattern {self.pattern!r}"
            )
        return tree

    def alt(self) -> list:
        branches = [self.seq()]
        while self._peek("|"):
            self.pos += 1
            branches.append(self.seq())
        return ["alt", branches]

    def seq(self) -> list:
        items: list = []
        while self.pos < len(self.toks):
            kind, ch = self.toks[self.pos]
            if kind == "lit":
                items.append(ch)
                self.pos += 1
            elif ch in "{[":
                self.pos += 1
                inner = self.alt()
                close = "}" if ch == "{" else "]"
                if not self._peek(close):
                    raise PatternError(f"missing {close!r} in quiz pattern {self.pattern!r}")
                self.pos += 1
                items.append(["opt" if ch == "{" else "group", inner])
            else:
                break
        return ["seq", items]

    def _peek(self, ch: str) -> bool:
        return self.pos < len(self.toks) and self.toks[self.pos] == ("op", ch)


def fold(text: str) -> str:
    """Case- and accent-insensitive form with single spaces (both sides of a comparison go through
    it)."""
    text = unicodedata.normalize("NFKD", text.translate(FOLD_EXTRA))
    text = "".join(c for c in text if not unicodedata.combining(c)).translate(FOLD_EXTRA)
    return " ".join(text.casefold().split())


def _regex(node: list | str) -> str:
    if isinstance(node, str):
        return re.escape(fold(node)) if node.strip() else " "
    kind, body = node
    if kind == "alt":
        return "(?:" + "|".join(_regex(b) for b in body) + ")"
    if kind == "seq":
        return "".join(_regex(x) for x in body)
    if kind == "opt":
        return "(?:" + _regex(body) + ")?"
    return _regex(body)


def _render(node: list | str) -> str:
    if isinstance(node, str):
        return node
    kind, body = node
    if kind == "alt":
        return _render(body[0])
    if kind == "seq":
        return "".join(_render(x) for x in body)
    return _render(body)


def compile_pattern(pattern: str) -> re.Pattern[str]:
    """A regex matching the folded accepted strings at the start of a folded answer, then a non-word
    char or end."""
    return re.compile(r"^" + _regex(_Parser(pattern).parse()) + r"(?!\w)")


def render(pattern: str) -> str:
    """A readable form of a pattern: optional parts kept, first alternative taken, overstrikes
    composed."""
    return " ".join(_render(_Parser(pattern).parse()).split())


def is_correct(pattern: str, answer: str) -> bool:
    """Exact-prefix match of a model answer (its first line) against a quiz pattern."""
    first_line = answer.strip().split("\n", 1)[0] if answer.strip() else ""
    return bool(compile_pattern(pattern).match(fold(first_line)))


FEW_SHOT = (("France", "Paris"), ("Japan", "Tokyo"), ("Kenya", "Nairobi"))


def few_shot_prompt(country: str, examples: Sequence[tuple[str, str]] = FEW_SHOT) -> str:
    """A few-shot completion prompt; the answer is what follows the last `A:`."""
    shots = "".join(f"Q: What is the capital of {q}?\nA: {a}\n\n" for q, a in examples)
    return f"{shots}Q: What is the capital of {country}?\nA:"


def pick_items(
    items: Sequence[dict[str, str]], count: int, exclude: Sequence[str] = ()
) -> list[dict[str, str]]:
    """`count` items spread evenly over the list (deterministic), leaving out the few-shot
    examples."""
    pool = [
        it
        for it in items
        if it.get("answer") and it.get("question") and render(it["question"]) not in exclude
    ]
    if count >= len(pool):
        return list(pool)
    step = len(pool) / count
    return [pool[int(i * step)] for i in range(count)]
